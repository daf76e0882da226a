"""The Unitree G1's robot models for Playground's G1 joystick tasks on a GPU machine without
network (README.md beside this file). Playground loads them from mujoco_menagerie's
unitree_g1/assets/, which it clones from GitHub on first use; the meshes it references (those
of the 29-DoF G1 with rubber hands) are also shipped inside mjlab's wheel on PyPI.

Here (with network to PyPI), into the carried wheels' folder:
    python3 -m pip download mjlab==1.6.0 --no-deps -d /tmp/mjlab
    python3 results/gpu/menagerie_models.py pack /tmp/mjlab/mjlab-1.6.0-py3-none-any.whl \
        .whl/menagerie/unitree_g1.tar.gz
There (after the wheels' install; learning_programme.sh does it):
    python3 results/gpu/menagerie_models.py install .whl/menagerie/unitree_g1.tar.gz

`pack` checks that every mesh Playground's G1 models reference is in the archive; `install`
writes only unitree_g1/assets/<file> entries into playground's menagerie folder.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROBOT = "unitree_g1"
WHEEL_ASSETS = "mjlab/asset_zoo/robots/unitree_g1/xmls/assets/"


def referenced_meshes() -> set[str]:
    """The file names Playground's G1 XMLs load from the menagerie's unitree_g1/assets/."""
    import mujoco_playground

    xmls = Path(mujoco_playground.__file__).parent / "_src" / "locomotion" / "g1" / "xmls"
    pattern = re.compile(r'file="[^"]*mujoco_menagerie/unitree_g1/assets/([^"/]+)"')
    return {name for path in xmls.glob("*.xml") for name in pattern.findall(path.read_text())}


def pack(wheel: Path, archive: Path) -> int:
    with zipfile.ZipFile(wheel) as source:
        members = {
            Path(name).name: name
            for name in source.namelist()
            if name.startswith(WHEEL_ASSETS) and not name.endswith("/")
        }
        missing = referenced_meshes() - set(members)
        if missing:
            print(f"{wheel.name} lacks {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "w:gz") as target:
            for name, member in sorted(members.items()):
                data = source.read(member)
                info = tarfile.TarInfo(f"{ROBOT}/assets/{name}")
                info.size = len(data)
                target.addfile(info, io.BytesIO(data))
    print(f"{archive}: {len(members)} files of {ROBOT}/assets")
    return 0


def install(archive: Path) -> int:
    from fastpop.envs.playground_envs import menagerie_path

    menagerie = menagerie_path()
    if menagerie is None:
        print("mujoco_playground is not installed", file=sys.stderr)
        return 2
    assets = menagerie / ROBOT / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    written = 0
    with tarfile.open(archive, "r:gz") as source:
        for member in source.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or parts[:2] != (ROBOT, "assets") or len(parts) != 3:
                continue  # only unitree_g1/assets/<file>: nothing written elsewhere
            (assets / parts[2]).write_bytes(source.extractfile(member).read())
            written += 1
    print(f"{assets}: {written} files")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="mjlab's wheel -> an archive of the G1's meshes")
    packing.add_argument("wheel", type=Path)
    packing.add_argument("archive", type=Path)
    installing = commands.add_parser("install", help="the archive -> playground's menagerie")
    installing.add_argument("archive", type=Path)
    args = parser.parse_args(argv)
    if args.command == "pack":
        return pack(args.wheel, args.archive)
    return install(args.archive)


if __name__ == "__main__":
    sys.exit(main())

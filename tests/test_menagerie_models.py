"""results/gpu/menagerie_models.py: the G1's meshes packed from mjlab's wheel only when every
mesh Playground's G1 models reference is there, and installed into playground's menagerie
folder writing nothing outside unitree_g1/assets/."""

from __future__ import annotations

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

from fastpop.envs import playground_envs
from tests.dependencies import require

require("mujoco_playground")

SCRIPT = Path(__file__).resolve().parents[1] / "results" / "gpu" / "menagerie_models.py"


def load_script():
    spec = importlib.util.spec_from_file_location("menagerie_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(path: Path, names) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name in names:
            wheel.writestr(f"mjlab/asset_zoo/robots/unitree_g1/xmls/assets/{name}", name)
        wheel.writestr("mjlab/other.py", "")
    return path


def test_packing_refuses_a_wheel_without_a_referenced_mesh_and_install_writes_only_assets(
    tmp_path, monkeypatch, capsys
):
    models = load_script()
    meshes = sorted(models.referenced_meshes())
    assert len(meshes) > 20 and "pelvis.STL" in meshes and "torso_link_rev_1_0.STL" in meshes
    archive = tmp_path / "out" / "unitree_g1.tar.gz"
    partial = fake_wheel(tmp_path / "partial.whl", meshes[1:])
    assert models.main(["pack", str(partial), str(archive)]) == 2
    assert f"partial.whl lacks {meshes[0]}" in capsys.readouterr().err and not archive.exists()
    wheel = fake_wheel(tmp_path / "mjlab.whl", meshes)
    assert models.main(["pack", str(wheel), str(archive)]) == 0
    with tarfile.open(archive) as packed:
        assert sorted(packed.getnames()) == [f"unitree_g1/assets/{name}" for name in meshes]
    # an archive with an entry outside unitree_g1/assets/: that entry is not written
    hostile = tmp_path / "hostile.tar.gz"
    with tarfile.open(hostile, "w:gz") as target:
        for name in ("unitree_g1/assets/pelvis.STL", "unitree_g1/../../escape.txt", "x.STL"):
            info = tarfile.TarInfo(name)
            info.size = 4
            target.addfile(info, io.BytesIO(b"data"))
    menagerie = tmp_path / "site" / "mujoco_menagerie"
    monkeypatch.setattr(playground_envs, "menagerie_path", lambda: menagerie)
    assert models.main(["install", str(hostile)]) == 0
    written = sorted(
        p.relative_to(tmp_path / "site").as_posix()
        for p in tmp_path.rglob("*")
        if p.is_file() and "site" in p.parts
    )
    assert written == ["mujoco_menagerie/unitree_g1/assets/pelvis.STL"]
    assert not (tmp_path / "escape.txt").exists()
    assert models.main(["install", str(archive)]) == 0
    assert len(list((menagerie / "unitree_g1" / "assets").iterdir())) == len(meshes)
    assert playground_envs._missing_models("G1JoystickFlatTerrain") is None  # now trained

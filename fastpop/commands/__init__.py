"""The `fastpop` command line and the commands that are not a training run: eval, export, pbt-
replay, video, bench's arguments."""

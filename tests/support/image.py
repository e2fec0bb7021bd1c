"""The image built by hack/build-image.sh, and a buildah container of it run as a pod's container would be.

buildah, not podman or docker: this sandbox has no Docker engine and podman's OCI runtime cannot set rlimits
here, while `buildah run --isolation chroot` needs no runtime at all.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from cozygpu.devcluster.binaries import repo_root

BUILD = repo_root() / "hack" / "build-image.sh"


def build() -> str:
    """The image's reference, built or found up to date; a skip with the script's reason where it cannot be."""
    # buildah runs the image below, so it builds it too: an image in docker's store would be out of reach.
    env = {**os.environ, "COZYGPU_IMAGE_BUILDER": "buildah"}
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, env=env, check=False)
    if done.returncode == 3:
        pytest.skip(f"the image cannot be built here (hack/build-image.sh): {done.stderr.strip()}")
    assert done.returncode == 0, f"hack/build-image.sh failed:\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


def buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout


def config(image: str) -> dict[str, Any]:
    """The image's OCI configuration: User, Entrypoint, Cmd, Env, Labels."""
    found: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    return found


# A Secret or projected volume's files: readable by the container's user, whoever it is (defaultMode 0644).
def write_volume(directory: Path, files: Mapping[str, bytes]) -> Path:
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    for name, data in files.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o644)
    return directory


def inside(root: Path, path: str) -> str:
    """`path` with the image's symlinks resolved (/var/run -> /run): buildah 1.28's chroot mode follows a
    destination's symlinks on the host, so it would mount over, and create directories in, the host's /run."""
    resolved = Path("/")
    parts = list(Path(path).parts[1:])
    for _ in range(64):
        if not parts:
            return str(resolved)
        here = resolved / parts.pop(0)
        on_disk = root / here.relative_to("/")
        if on_disk.is_symlink():
            target = Path(os.readlink(on_disk))
            parts = [*target.parts[1:], *parts] if target.is_absolute() else [*target.parts, *parts]
            resolved = Path("/") if target.is_absolute() else resolved
        else:
            resolved = here
    raise AssertionError(f"{path}: too many symlinks in the image")


class Container:
    """A working container of the image; `run` starts a command in it the way a kubelet starts one."""

    def __init__(self, image: str, mounts: Mapping[str, Path], env: Mapping[str, str]) -> None:
        self.name = buildah("from", "--pull-never", image).strip()
        root = Path(buildah("mount", self.name).strip())
        try:
            # Read-only binds where the chart mounts Secrets, a fresh tmpfs where it mounts its emptyDir.
            self.mounts = [f"type=bind,src={src},dst={inside(root, dst)},ro" for dst, src in mounts.items()]
        finally:
            buildah("umount", self.name)
        self.mounts.append("type=tmpfs,dst=/tmp")
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self, command: Sequence[str]) -> list[str]:
        # No --user: the image's own USER runs, as in a pod with runAsNonRoot and no runAsUser.
        flags = ["--isolation", "chroot", "--network", "host", "--cap-drop", "all"]
        for mount in self.mounts:
            flags += ["--mount", mount]
        for key, value in self.env.items():
            flags += ["--env", f"{key}={value}"]
        return ["buildah", "run", *flags, self.name, "--", *command]

    def run(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, check=False, timeout=120)

    def start(self, command: Sequence[str], log: Path) -> None:
        with log.open("ab") as out:
            # A session of its own, so the process group is only this container's processes.
            self.proc = subprocess.Popen(
                self.argv(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> list[dict[str, Any]]:
        """The command's own processes (not buildah's): pid, uid and argv, from /proc."""
        if self.proc is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != self.proc.pid:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
                uid = next(
                    int(line.split()[1])
                    for line in (entry / "status").read_text().splitlines()
                    if line.startswith("Uid:")
                )
            except (OSError, ProcessLookupError):
                continue
            if argv and argv[0].startswith(b"/opt/cozygpu/"):
                found.append({"pid": int(entry.name), "uid": uid, "argv": [a.decode() for a in argv]})
        return found

    def stop(self) -> int | None:
        """SIGTERM to the command itself, as a kubelet sends it (buildah would SIGKILL it); its exit code."""
        if self.proc is None:
            return None
        for p in self.processes():
            os.kill(p["pid"], signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def snapshot(self) -> dict[str, tuple[int, ...]]:
        """Every path of the container's root filesystem but /tmp, /proc, /sys and /dev, with its mode, owner,
        size and modification time: two snapshots differ where something was written."""
        root = Path(buildah("mount", self.name).strip())
        files: dict[str, tuple[int, ...]] = {}
        try:
            for directory, dirs, names in os.walk(root):
                if Path(directory) == root:
                    dirs[:] = [d for d in dirs if d not in {"tmp", "proc", "sys", "dev"}]
                for name in [*dirs, *names]:
                    path = Path(directory) / name
                    st = path.lstat()
                    size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
                    files[str(path.relative_to(root))] = (st.st_mode, st.st_uid, size, st.st_mtime_ns)
        finally:
            buildah("umount", self.name)
        return files

    def remove(self) -> None:
        self.stop()
        buildah("rm", self.name)

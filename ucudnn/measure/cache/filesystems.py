"""Which filesystem a path is on, and whether it is one that hosts share over a network.

SQLite's locks are POSIX advisory locks, which a network filesystem keeps across nodes only where
mounted so, and SQLite's documentation warns against sharing a database file over one
(docs/cache.md, "What is safe where"). The type is the one /proc/mounts gives the mount holding
the path (Linux); elsewhere it is unknown ('').
"""
from __future__ import annotations

import os
import re
from pathlib import Path

MOUNTS = Path("/proc/mounts")
# The types /proc/mounts gives filesystems that hosts share over a network
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph-fuse", "glusterfs",
    "fuse.glusterfs", "afs", "panfs", "wekafs", "orangefs", "pvfs2", "fuse.sshfs",
})


def _unescaped(field: str) -> str:
    """A path of /proc/mounts, whose spaces, tabs and backslashes are written in octal (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def _existing(path: Path) -> Path:
    """`path`, or where it does not exist yet, its nearest folder that does."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.resolve()


def filesystem_type(path: str | os.PathLike) -> str:
    """The type of the filesystem `path` is on (where it does not exist yet, its nearest existing
    folder), as /proc/mounts names it (the deepest mount holding it, the last of several on one
    point); '' where unknown."""
    try:
        table = MOUNTS.read_text()
    except OSError:
        return ""
    place, depth, found = _existing(Path(path)), -1, ""
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(_unescaped(fields[1]))
        if (point == place or point in place.parents) and len(point.parts) >= depth:
            depth, found = len(point.parts), fields[2]
    return found

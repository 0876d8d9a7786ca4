"""POSIX shared-memory regions a worker creates, fills with logits and registers (HOST_SHM).

The server maps the object read-only and checks, per step, that every slice lies inside the
registered size. It accepts only objects owned by an allowed uid (`--shm_allowed_uids`, by
default its own), so run the worker and samplerd under one uid (the deploy/ manifests set one
pod-level runAsUser). Objects are created mode 0600, exclusively; register_shm unlinks the name
as soon as samplerd has mapped the region (a crashed worker leaves nothing in /dev/shm), and
close() unmaps.
"""
import ctypes
import mmap
import os
import secrets

import numpy as np

_SHM_DIR = "/dev/shm"  # where glibc's shm_open keeps objects on Linux
_MAP_FIXED = 0x10  # Linux; the mmap module does not export it
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]


def _create(path, byte_size, mode, fill):
    """Creates the shm object `path` (exclusively, not through a symlink) of `byte_size` bytes
    and returns `fill(fd)`; if anything fails the object is removed again. The descriptor is
    closed either way (a mapping keeps the memory)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.ftruncate(fd, byte_size)
        return fill(fd)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


class ShmRegion:
    """A shared-memory object of `byte_size` bytes, mapped read-write in this process."""

    def __init__(self, byte_size: int, name: str = None, mode: int = 0o600):
        if byte_size <= 0:
            raise ValueError("byte_size must be positive")
        self.name = name or f"/samplerd-{os.getpid()}-{secrets.token_hex(6)}"
        self._base_name = self.name
        # The name steps use for it (ShmLogits): the one it is registered under, which stays
        # when relink() moves the memory to a new shm name.
        self.buffer_name = self.name
        self._generation = 0
        if not self.name.startswith("/") or "/" in self.name[1:]:
            raise ValueError(f"shm name {self.name!r} must be '/' then a name without '/'")
        self.byte_size = byte_size
        self._mode = mode
        path = _SHM_DIR + self.name
        self._map = _create(path, byte_size, mode, lambda fd: mmap.mmap(
            fd, byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        self._path = path
        # The mapping's address, for byte_offset_of (the temporary view is dropped at once: a
        # live one would keep close() from unmapping).
        base = np.frombuffer(self._map, dtype=np.uint8)
        self._address = base.__array_interface__["data"][0]
        del base

    def ndarray(self, shape, dtype=np.float32, byte_offset: int = 0) -> np.ndarray:
        """A numpy view of the region (write logits into it in place)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        if byte_offset < 0 or byte_offset + count * dtype.itemsize > self.byte_size:
            raise ValueError(f"view of {count} x {dtype} at {byte_offset} exceeds the region's "
                             f"{self.byte_size} bytes")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=byte_offset).reshape(shape)

    def byte_offset_of(self, array: np.ndarray) -> int:
        """Where a view returned by ndarray() starts, in bytes from the region's start."""
        offset = array.__array_interface__["data"][0] - self._address
        if offset < 0 or offset + array.nbytes > self.byte_size:
            raise ValueError("the array does not lie inside this region")
        return offset

    def unlink(self):
        """Removes the object's name from /dev/shm; the memory stays while it is mapped
        (register_shm calls this once samplerd has mapped the region)."""
        if self._path is None:
            return
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        self._path = None

    def relink(self):
        """Moves the region's memory to a new shm object (its name: the first name plus ".N"),
        mapped at the same address, so every numpy view stays valid. The client calls this to
        register the region with a restarted samplerd: the old name was unlinked, and samplerd
        maps objects by name. The contents are copied; the worker must not write meanwhile
        (the client does it on the caller's thread, before the step that needs it)."""
        if self._map is None:
            raise ValueError("the region is closed")
        while True:
            self._generation += 1
            name = f"{self._base_name}.{self._generation}"
            path = _SHM_DIR + name
            try:
                _create(path, self.byte_size, self._mode, self._move_into)
                break
            except FileExistsError:
                continue
        self.unlink()  # the old name, if it is still there
        self.name = name
        self._path = path

    def _move_into(self, fd):
        """Copies the region into the new object `fd`, then maps it over the old mapping."""
        with memoryview(self._map) as view:
            done = 0
            while done < self.byte_size:
                done += os.pwrite(fd, view[done:], done)
        got = _libc.mmap(ctypes.c_void_p(self._address), ctypes.c_size_t(self.byte_size),
                         mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd,
                         ctypes.c_long(0))
        if got != self._address:
            raise OSError(ctypes.get_errno(), "mmap(MAP_FIXED) of the new shm object failed")

    def close(self):
        """Unmaps the object and unlinks its name if it is still there (unregister it from
        the server first)."""
        if self._map is None:
            return
        try:
            self._map.close()
        except BufferError as e:
            raise BufferError("a numpy view of the region is still alive; drop it before "
                              "close()") from e
        self._map = None
        self.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

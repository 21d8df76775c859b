"""A small safetensors reader, independent of pipec's own code.

Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
unsigned header length N, N bytes of UTF-8 JSON (possibly padded with
spaces), then the data buffer. The JSON maps tensor names to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
start of the data buffer) and may hold a "__metadata__" object of strings.

    read_safetensors(path) -> (dict name -> numpy array, metadata dict)
    load_checkpoint(step_dir) -> dict name -> numpy array (all stage files)
"""
import glob
import json
import os
import struct

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "BOOL": "?",
}


class SafetensorsError(Exception):
    pass


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: {len(blob)} bytes, shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise SafetensorsError(f"{path}: header length {hlen} runs past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dt!r}")
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        npdt = np.dtype(_DTYPES[dt])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= begin <= end <= len(data)):
            raise SafetensorsError(f"{path}: tensor {name!r} offsets [{begin}, {end}] outside the data ({len(data)} bytes)")
        if end - begin != count * npdt.itemsize:
            raise SafetensorsError(f"{path}: tensor {name!r} has {end - begin} bytes, shape {shape} {dt} needs {count * npdt.itemsize}")
        arr = np.frombuffer(data[begin:end], dtype=npdt, count=count).reshape(shape)
        tensors[name] = arr.copy()
        spans.append((begin, end, name))
    # The format requires the tensors to cover the buffer without overlap.
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    if pos != len(data):
        raise SafetensorsError(f"{path}: {len(data) - pos} trailing bytes after the last tensor")
    return tensors, meta


def load_checkpoint(step_dir):
    """Merges every stage*.safetensors of a checkpoint step folder (or of a
    weights/ folder). A tensor in several files (a tied weight: every stage
    that reads it holds a copy) must be bitwise equal in all of them."""
    files = sorted(glob.glob(os.path.join(step_dir, "stage*.safetensors")))
    if not files:
        raise SafetensorsError(f"{step_dir}: no stage*.safetensors files")
    merged = {}
    for path in files:
        tensors, _ = read_safetensors(path)
        for name, arr in tensors.items():
            if name in merged:
                if merged[name].shape != arr.shape or merged[name].tobytes() != arr.tobytes():
                    raise SafetensorsError(f"{step_dir}: tensor {name!r} differs between stage files "
                                           f"({os.path.basename(path)} and an earlier one)")
                continue
            merged[name] = arr
    return merged


def latest_checkpoint(ckpt_dir):
    """The step folder named by ckpt_dir/latest."""
    with open(os.path.join(ckpt_dir, "latest")) as f:
        name = f.read().strip()
    return os.path.join(ckpt_dir, name)

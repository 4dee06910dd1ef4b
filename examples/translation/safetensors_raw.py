"""The safetensors layout by hand (8-byte little-endian header length, JSON header, raw data), with
the standard library only: the one reader of graft's weights files for the Python scripts
(ct2_convert.py and torch_roundtrip.py here, bench/torch_quality.py), each of which turns the bytes
into its own arrays (numpy, torch)."""
import json
import struct


def read_raw(path):
    """[(name, dtype, shape, data)] of each tensor of the safetensors file `path`, in header order
    ("__metadata__" left out); dtype is the header's ("F32", "I64", ...), data the tensor's bytes."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    return [(name, info["dtype"], info["shape"], data[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items() if name != "__metadata__"]

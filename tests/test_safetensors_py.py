"""graft's safetensors reader and writer against Python's `safetensors` package (with numpy).

    test_safetensors_py.py SAFETENSORS_VALUES WORK_DIR

1. Python writes BF16, F16, I8, F32, F64 and I64 tensors (F16 and the others from numpy arrays
   through safetensors.numpy.save_file, BF16 as bit patterns through safetensors' raw serialize
   API, numpy having no bfloat16); graft loads them (safetensors_values dump) to the same values
   in the same dtypes.
2. graft writes the same values in every dtype (safetensors_values write, graft's own rounding);
   Python loads the file with safetensors to the same dtypes and values.

The expected values are this script's own: every rounding into bf16 and f16 is computed here
exactly (fractions, round half to even), never by graft, and F16 is checked against numpy too.
Exit 0 when everything matches, 1 naming the first difference.
"""
import math
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import safetensors
import safetensors.numpy

# Ties, a value that float32 would round twice (1 + 2^-8 + 2^-30 is a bf16 tie only after
# float32), subnormals of both formats, overflow to inf, signed zero, inf and NaN.
FLOATS = [1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-30, 1 / 3, 0.1, -2.5, 65504.0, 65519.99,
          65520.0, 2**-24, 3 * 2**-26, 2**-133, 1e-40, 3.0e38, 3.4e38, -0.0, math.inf, -math.inf,
          math.nan, 1e300]
INTS = [-128, -1, 0, 1, 42, 127]
# (significant bits, smallest normal exponent, largest finite value) of each binary format.
FORMATS = {"bf16": (8, -126, (2 - 2**-7) * 2.0**127), "f16": (11, -14, 65504.0),
           "f32": (24, -126, (2 - 2**-23) * 2.0**127)}


def round_to(x, fmt):
    """x rounded to the format fmt, to nearest with ties to even, computed exactly."""
    bits, emin, largest = FORMATS[fmt]
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    q = Fraction(abs(x))
    e = math.floor(math.log2(abs(x)))
    while Fraction(2) ** e > q:  # log2 of a double can be one off
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    ulp = Fraction(2) ** (max(e, emin) - bits + 1)  # subnormals share the smallest binade's ulp
    value = round(q / ulp) * ulp  # Python rounds a Fraction's halves to even
    if value > Fraction(largest):  # at or past largest + ulp / 2 (the tie goes to even: inf)
        return math.copysign(math.inf, x)
    return math.copysign(float(value), x)


def bf16_bits(values):
    """bfloat16 bit patterns of values already rounded to bf16 (exact in float32)."""
    f = np.array(values, dtype=np.float64).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def expected(dtype):
    """The values a tensor of graft's short dtype name holds: FLOATS or INTS, rounded here."""
    if dtype in FORMATS:
        return [round_to(x, dtype) for x in FLOATS]
    if dtype == "f64":
        return list(FLOATS)
    return [float(i) for i in INTS]


def same(a, b):
    """Equal as stored: NaN equals NaN, -0 differs from 0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def check(label, got, want):
    if len(got) != len(want):
        sys.exit(f"test_safetensors_py: FAILED: {label}: {len(got)} values, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if not same(g, w):
            src = f" (from {FLOATS[i]!r})" if len(want) == len(FLOATS) else ""
            sys.exit(f"test_safetensors_py: FAILED: {label}: value {i} is {g!r}, "
                     f"expected {w!r}{src}")


ST_NAMES = {"bf16": "BF16", "f16": "F16", "f32": "F32", "f64": "F64", "i8": "I8", "i64": "I64"}


def write_python_files(work):
    """Every dtype through the safetensors package: numpy arrays by safetensors.numpy.save_file,
    BF16 (numpy has none) as raw bits by safetensors.serialize. Returns the two paths."""
    with np.errstate(over="ignore"):
        arrays = {"f16": np.array(FLOATS, dtype=np.float64).astype(np.float16),
                  "f32": np.array(expected("f32"), dtype=np.float32),
                  "f64": np.array(FLOATS, dtype=np.float64),
                  "i8": np.array(INTS, dtype=np.int8), "i64": np.array(INTS, dtype=np.int64)}
    # numpy's own float64 -> float16 conversion against this script's rounding.
    check("numpy float16 against the reference", [float(v) for v in arrays["f16"]],
          expected("f16"))
    numpy_file = os.path.join(work, "numpy.safetensors")
    bf16_file = os.path.join(work, "bf16.safetensors")
    safetensors.numpy.save_file(arrays, numpy_file, metadata={"writer": "python"})
    with open(bf16_file, "wb") as f:
        bits = bf16_bits(expected("bf16")).tobytes()
        f.write(serialize({"bf16": ("BF16", [len(FLOATS)], bits)}, {"writer": "python"}))
    return [numpy_file, bf16_file]


def serialize(tensors, metadata):
    """safetensors.serialize over raw bytes: TensorSpec (0.8 on) or the older dict form."""
    if hasattr(safetensors, "TensorSpec"):
        long_names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                      "I8": "int8", "I64": "int64"}
        keep = {name: np.frombuffer(data, dtype=np.uint8).copy()
                for name, (_, _, data) in tensors.items()}
        specs = {name: safetensors.TensorSpec(dtype=long_names[dt], shape=shape,
                                              data_ptr=keep[name].ctypes.data,
                                              data_len=keep[name].nbytes)
                 for name, (dt, shape, _) in tensors.items()}
        return safetensors.serialize(specs, metadata)
    return safetensors.serialize({name: {"dtype": dt, "shape": shape, "data": data}
                                  for name, (dt, shape, data) in tensors.items()}, metadata)


def graft_values(tool, path):
    """{name: (graft's dtype, values)} of the file as graft loads it."""
    out = subprocess.run([tool, "dump", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"test_safetensors_py: FAILED: graft could not load {path}: {out.stderr}")
    loaded = {}
    for line in out.stdout.splitlines():
        name, dtype, *rest = line.split(" ")
        shape_end = next(i for i, w in enumerate(rest) if w.endswith(")"))
        loaded[name] = (dtype, [float(v) for v in rest[shape_end + 1:]])
    return loaded


def graft_reads_python(tool, work):
    loaded = {}
    for path in write_python_files(work):
        loaded.update(graft_values(tool, path))
    if set(loaded) != set(ST_NAMES):
        sys.exit(f"test_safetensors_py: FAILED: graft listed {sorted(loaded)}")
    for name, (dtype, values) in loaded.items():
        if dtype != name:  # kept as stored: never widened
            sys.exit(f"test_safetensors_py: FAILED: graft loaded {ST_NAMES[name]} as {dtype}")
        check(f"graft reading Python's {ST_NAMES[name]}", values, expected(name))


def python_reads_graft(tool, work):
    path = os.path.join(work, "graft.safetensors")
    args = [tool, "write", path] + [repr(x) for x in FLOATS] + ["--"] + [str(i) for i in INTS]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"test_safetensors_py: FAILED: graft could not write {path}: {out.stderr}")
    with open(path, "rb") as f:
        raw = dict(safetensors.deserialize(f.read()))
    for name, st in ST_NAMES.items():
        if raw[name]["dtype"] != st:
            sys.exit(f"test_safetensors_py: FAILED: graft wrote {name} as {raw[name]['dtype']}")
    bits = np.frombuffer(bytes(raw["bf16"]["data"]), dtype=np.uint16)
    bf16 = (bits.astype(np.uint32) << 16).view(np.float32)
    check("Python reading graft's BF16", [float(v) for v in bf16], expected("bf16"))
    with safetensors.safe_open(path, framework="numpy") as f:
        for name in ST_NAMES:
            if name == "bf16":
                continue  # numpy has no bfloat16
            a = f.get_tensor(name)
            check(f"Python reading graft's {ST_NAMES[name]} ({a.dtype})", [float(v) for v in a],
                  expected(name))


def main():
    tool, work = sys.argv[1], sys.argv[2]
    graft_reads_python(tool, work)
    python_reads_graft(tool, work)
    print(f"test_safetensors_py: BF16, F16, I8, F32, F64 and I64 agree both ways "
          f"(safetensors {safetensors.__version__}, numpy {np.__version__}, {len(FLOATS)} floats)")


if __name__ == "__main__":
    main()

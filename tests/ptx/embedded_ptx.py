"""The PTX a kpool CUDA kernel object embeds, and its kernels.

Halide embeds each CUDA module's PTX in the object as a NUL-terminated
string. The build rewrites the comment lines before its `.version` header
(cmake/ptx_for_family.py raises the header to the family's target), so a
module is read from its `.version` line to its NUL.
"""
import re

ENTRY = re.compile(rb"^(?:\.visible\s+|\.weak\s+)?\.entry\s+(\w+)", re.M)


def read_modules(obj_path):
    """The PTX modules embedded in the object at obj_path, as bytes."""
    with open(obj_path, "rb") as f:
        data = f.read()
    modules = []
    start = data.find(b".version ")
    while start >= 0:
        end = data.find(b"\0", start)
        end = len(data) if end < 0 else end
        modules.append(data[start:end])
        start = data.find(b".version ", end)
    return modules


def kernels(ptx):
    """(name, text) of each kernel entry of a PTX module, in module order."""
    found = list(ENTRY.finditer(ptx))
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(ptx)
        yield m.group(1).decode(), ptx[m.start():end]


def object_kernels(obj_path):
    """(name, text) of every kernel of every module the object embeds."""
    return [k for ptx in read_modules(obj_path) for k in kernels(ptx)]

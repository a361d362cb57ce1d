"""The op table (ops/*.toml) read once, and what the build makes of it.

Each table file holds an op's C entry points ([[entry]]: the arguments and
their rules, what it returns), its torch operators' schemas ([torch]) and its kernels ([[kernel]]: the generator,
the variant axes it ranges over, its function name and generator parameters
as templates over those axes, its dispatch kind and the kind's Halide
signature). ops/axes.toml names each axis's values and their attributes.

    op_table.py kernels --table DIR... --device NAME --cuda --axis pool=4,16 ... --out FILE
        the kpool_add_kernel() calls of one device's variant matrix, as CMake
        (a tuning candidate's with --candidate ID --tune OPS)
    op_table.py tables --table DIR... --out-dir DIR [--tuning]
        the runtime's kinds and entry points, the version script, and the
        table as JSON for the Python package (next to libkpool.so)

A malformed table stops the configure with the file and the reason.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import string
import sys
import tomllib
import types

ENTRY_KEYS = {"name", "arguments", "returns", "exec", "written", "torch_extension"}
KERNEL_KEYS = {"kind", "generator", "devices", "axes", "values", "function", "params", "key", "signature", "flags",
               "tune", "tune_devices", "warm_up"}
FILE_KEYS = {"entry", "kernel", "torch", "runtime_sources", "generator_sources"}
FLAGS = {"coherent_loads", "decode_ptx"}
# An argument's type: its C type (and that of the op function the entry point
# wraps), and its ctypes spelling in python/kpool/_lib.py.
ARGUMENT_TYPES = {
    "tensor": ("const kpool_tensor *", "tensor"),
    "int32": ("int32_t", "int32"),
    "int64": ("int64_t", "int64"),
    "int64_out": ("int64_t *", "int64_out"),
    "dtype": ("kpool_dtype", "int"),
    "status_code": ("kpool_status_code", "int"),
    "pointer": ("void *", "pointer"),
    "shape": ("const int64_t *", "int64_out"),
    "images": ("kpool_cuda_images *", "pointer"),
}
# inner: its innermost dim is read contiguously; output: the call writes it;
# python_name=NAME: the drop-in Python API's name of it, which the torch
# extension's messages use (seed's pool_size is the reference's `kpool`).
RULES = {"inner", "output"}
RETURNS = {"status": "kpool_status_code", "skipped_completions": "kpool_status_code", "string": "const char *",
           "int32": "int32_t", "tensor_value": "kpool_tensor"}
SIGNATURE_TYPES = {"Buf", "bool", "int32_t", "int64_t"}


class TableError(Exception):
    pass


def _fail(path, message):
    raise TableError(f"{path}: {message}")


def _argument(path, text):
    name, _, rest = text.partition(":")
    words = rest.split()
    if not name.strip().isidentifier() or not words or words[0] not in ARGUMENT_TYPES:
        _fail(path, f"argument {text!r} is not \"name: type [rules]\" (types: {', '.join(ARGUMENT_TYPES)})")
    python_name = [w.partition("=")[2] for w in words[1:] if w.startswith("python_name=")]
    unknown = [w for w in words[1:] if w not in RULES and not w.startswith("python_name=")]
    if unknown:
        _fail(path, f"argument {text!r}: unknown rule {unknown} (rules: {sorted(RULES)}, python_name=NAME)")
    return {"name": name.strip(), "type": words[0], "inner": "inner" in words, "output": "output" in words,
            "python_name": python_name[0] if python_name else name.strip()}


def _signature(path, kind, text):
    types_ = []
    for arg in text.split(","):
        words = arg.split()
        if len(words) != 2 or words[0] not in SIGNATURE_TYPES:
            _fail(path, f"{kind}: signature argument {arg.strip()!r} is not \"type name\" ({sorted(SIGNATURE_TYPES)})")
        types_.append(words[0])
    return types_


def _placeholders(template):
    return {field.split(".")[0] for _, field, _, _ in string.Formatter().parse(template) if field}


def load(dirs):
    """The table: {axes, files, entries, kernels, torch}, checked."""
    axes, files = None, []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if not name.endswith(".toml"):
                continue
            with open(path, "rb") as f:
                try:
                    data = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    _fail(path, str(e))
            if name == "axes.toml":
                axes = data
            else:
                files.append((path, data))
    if axes is None:
        raise TableError(f"no axes.toml in {', '.join(dirs)}")
    table = {"axes": axes, "files": [], "entries": [], "kernels": [], "torch": {}}
    kinds, names, slots = {}, set(), set()
    for path, data in files:
        if set(data) - FILE_KEYS:
            _fail(path, f"unknown keys {sorted(set(data) - FILE_KEYS)} (known: {sorted(FILE_KEYS)})")
        base = os.path.dirname(os.path.abspath(path))
        op = {"name": os.path.splitext(os.path.basename(path))[0],
              "runtime_sources": [os.path.join(base, s) for s in data.get("runtime_sources", [])],
              "generator_sources": [os.path.join(base, s) for s in data.get("generator_sources", [])]}
        table["files"].append(op)
        for entry in data.get("entry", []):
            if set(entry) - ENTRY_KEYS or "name" not in entry:
                _fail(path, f"entry {entry.get('name')}: unknown keys {sorted(set(entry) - ENTRY_KEYS)}")
            if entry["name"] in names:
                _fail(path, f"entry kpool_{entry['name']} is declared twice")
            names.add(entry["name"])
            returns = entry.get("returns", "status")
            if returns not in RETURNS:
                _fail(path, f"entry {entry['name']}: returns {returns!r} is not one of {sorted(RETURNS)}")
            slot = entry.get("torch_extension")
            if slot is not None:
                if slot in slots:
                    _fail(path, f"entry {entry['name']}: torch_extension slot {slot} is taken")
                slots.add(slot)
            written = entry.get("written", False)
            table["entries"].append({
                "name": entry["name"], "symbol": "kpool_" + entry["name"],
                "arguments": [_argument(path, a) for a in entry.get("arguments", [])],
                "returns": returns, "written": written,
                # The op entry points end with the call's exec and status.
                "exec": entry.get("exec", not written), "status": not written,
                "torch_extension": slot, "op": op["name"]})
        for name, schema in data.get("torch", {}).items():
            if name in table["torch"]:
                _fail(path, f"torch op {name} is declared twice")
            table["torch"][name] = schema
        for kernel in data.get("kernel", []):
            kind = kernel.get("kind")
            if set(kernel) - KERNEL_KEYS:
                _fail(path, f"kernel {kind}: unknown keys {sorted(set(kernel) - KERNEL_KEYS)}")
            for required in ("kind", "generator", "function", "signature"):
                if required not in kernel:
                    _fail(path, f"kernel {kind}: no {required}")
            if kind in kinds:
                _fail(path, f"kernel kind {kind} is declared twice (also in {kinds[kind]})")
            kinds[kind] = path
            k = dict(kernel, op=op["name"], path=path)
            k.setdefault("devices", "all")
            k.setdefault("axes", [])
            k.setdefault("values", {})
            k.setdefault("params", [])
            k.setdefault("flags", [])
            k["key"] = {"pool": "0", "type": "none", "arithmetic": "any", **kernel.get("key", {})}
            if k["devices"] not in ("all", "cpu", "cuda"):
                _fail(path, f"kernel {kind}: devices {k['devices']!r} is not all, cpu or cuda")
            if set(k["flags"]) - FLAGS:
                _fail(path, f"kernel {kind}: unknown flags {sorted(set(k['flags']) - FLAGS)}")
            for axis in k["axes"]:
                if axis not in axes:
                    _fail(path, f"kernel {kind}: axis {axis!r} is not in axes.toml ({', '.join(axes)})")
            for axis, source in k["values"].items():
                if axis not in k["axes"] or source not in axes:
                    _fail(path, f"kernel {kind}: values {axis} = {source!r} names no axis of it / of axes.toml")
            for template in [k["function"], *k["params"], *k["key"].values()]:
                unknown = _placeholders(template) - set(k["axes"])
                if unknown:
                    _fail(path, f"kernel {kind}: {template!r} uses {sorted(unknown)}, not among its axes {k['axes']}")
            k["signature_types"] = _signature(path, kind, k["signature"])
            table["kernels"].append(k)
    return table


class _Value(str):
    """An axis value: formats as itself, {axis.attribute} as its attributes."""

    def __new__(cls, value, attributes):
        v = super().__new__(cls, value)
        v.__dict__.update(attributes)
        return v


def variants(table, device, cuda, axis_values, candidate=None, tune_ops=None, kernel_ops=None):
    """Each kernel variant of the device: (kernel, function, params, key).
    axis_values: the build's values of each axis; an axis it leaves out has
    the values axes.toml declares."""
    device_class = "cuda" if cuda else "cpu"
    axis_values = {**{name: list(values) for name, values in table["axes"].items() if values}, **axis_values}
    for k in table["kernels"]:
        if k["devices"] not in ("all", device_class):
            continue
        if kernel_ops is not None and k["op"] not in kernel_ops:
            continue
        if candidate is not None and (k.get("tune") not in tune_ops or
                                      k.get("tune_devices", "all") not in ("all", device_class)):
            continue
        ranges = []
        for axis in k["axes"]:
            source = k["values"].get(axis, axis)
            if source not in axis_values:
                raise TableError(f"{k['path']}: kernel {k['kind']}: the build gives no values of axis {source}")
            attributes = table["axes"][source]
            unknown = [v for v in axis_values[source] if attributes and v not in attributes]
            if unknown:
                raise TableError(f"axis {source}: the build asks for {unknown}, which axes.toml does not declare "
                                 f"(it has {', '.join(attributes)})")
            ranges.append([_Value(v, attributes.get(v, {})) for v in axis_values[source]])
        for combination in itertools.product(*ranges):
            at = dict(zip(k["axes"], combination))
            function = f"kpool_{device}_" + k["function"].format(**at)
            if candidate is not None:
                function += f"_c{candidate}"
            params = [p.format(**at) for p in k["params"]]
            key = {name: v.format(**at) for name, v in k["key"].items()}
            yield k, function, params, key


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_kernels(table, args):
    axis_values = {}
    for a in args.axis:
        name, _, values = a.partition("=")
        axis_values[name] = [v for v in values.split(",") if v]
    kernel_ops = args.kernel_ops.split(",") if args.kernel_ops else None
    tune_ops = args.tune.split(",") if args.tune else None
    lines = [f"# Generated by cmake/op_table.py from the op table: the {args.device} kernels.\n"]
    for k, function, params, key in variants(table, args.device, args.cuda, axis_values, args.candidate, tune_ops,
                                             kernel_ops):
        generator_target = ""
        op = next(o for o in table["files"] if o["name"] == k["op"])
        if op["generator_sources"]:
            generator_target = f" GENERATOR_TARGET kpool_{k['op']}_generator"
        flags = " COHERENT_LOADS" if "coherent_loads" in k["flags"] else ""
        variant = f"{k['kind']}, {key['pool']}, {key['type']}, {key['arithmetic']}, {function}"
        lines.append(f"kpool_add_kernel({function} GENERATOR {k['generator']}{generator_target} DEVICE ${{device}}"
                     f" ${{candidate}}{flags}" + (" PARAMS " + " ".join(params) if params else "") +
                     f" VARIANT {_quote(variant)})\n")
        if "decode_ptx" in k["flags"] and args.cuda:
            lines.append("set_property(GLOBAL APPEND PROPERTY KPOOL_CUDA_DECODE_UPDATE_OBJECTS"
                         f" \"${{CMAKE_CURRENT_BINARY_DIR}}/{function}${{CMAKE_C_OUTPUT_EXTENSION}}\")\n")
    _write(args.out, "".join(lines))


def _c_arguments(entry):
    args = [f"{ARGUMENT_TYPES[a['type']][0]}{'' if ARGUMENT_TYPES[a['type']][0].endswith('*') else ' '}{a['name']}"
            for a in entry["arguments"]]
    if entry["exec"]:
        args.append("const kpool_exec *exec")
    return args


def write_tables(table, args):
    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    # The dispatch kinds and each one's Halide signature (runtime/dispatch.h).
    kinds = ["// Generated by cmake/op_table.py from the op table: X(kind, the generated function's arguments).\n",
             "#define KPOOL_FOR_EACH_KERNEL_KIND(X) \\\n"]
    kinds += [f"    X({k['kind']}, {', '.join(k['signature_types'])}) \\\n" for k in table["kernels"]]
    kinds.append("\n// X(kind, warm-up call) of every kind a device warms up (runtime/warm_up.cpp).\n")
    kinds.append("#define KPOOL_FOR_EACH_WARM_UP(X) \\\n")
    kinds += [f"    X({k['kind']}, warm_up_{k['warm_up']}) \\\n" for k in table["kernels"]
              if k.get("warm_up") and k["devices"] != "cpu"]
    _write(os.path.join(out, "kpool_kernel_kinds.inc"), "".join(kinds) + "\n")

    # The ops the entry points wrap (runtime/ops/), and the entry points.
    ops = ["// Generated by cmake/op_table.py from the op table: the op each C entry point runs.\n",
           "#pragma once\n\n#include <cstdint>\n\n#include \"kpool/kpool.h\"\n\nnamespace kpool::rt {\n\n"]
    entries = ["// Generated by cmake/op_table.py from the op table: the C entry points (runtime/kpool_api.cpp).\n"]
    declarations = ["/* Generated by cmake/op_table.py from the op table: the C entry points. */\n"
                    "#pragma once\n\n#include \"kpool/kpool.h\"\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"]
    for e in table["entries"]:
        c_args = _c_arguments(e)
        public = c_args + (["kpool_status *status"] if e["status"] else [])
        declarations.append(f"{RETURNS[e['returns']]} {e['symbol']}({', '.join(public) or 'void'});\n")
        if e["written"]:
            continue
        result = "int64_t" if e["returns"] == "skipped_completions" else "void"
        ops.append(f"{result} {e['name']}({', '.join(c_args)});\n")
        call = f"{e['name']}({', '.join(a['name'] for a in e['arguments'] + ([{'name': 'exec'}] if e['exec'] else []))})"
        runner = "run" if e["returns"] == "skipped_completions" else "run_op"
        entries.append(f"kpool_status_code {e['symbol']}({', '.join(public)}) {{\n"
                       f"    return {runner}(status, [&] {{ return {call}; }});\n}}\n\n")
    ops.append("\n}  // namespace kpool::rt\n")
    declarations.append("\n#ifdef __cplusplus\n}\n#endif\n")
    _write(os.path.join(out, "kpool_op_functions.h"), "".join(ops))
    _write(os.path.join(out, "kpool_entry_points.inc"), "".join(entries))
    _write(os.path.join(out, "kpool_entry_points.h"), "".join(declarations))

    _write_torch_calls(table, out)

    # The version script: the C API alone (and the tuner's selector in a
    # tuning build, tools/tune).
    symbols = [e["symbol"] for e in table["entries"]] + (["kpool_tune_select"] if args.tuning else [])
    _write(os.path.join(out, "kpool.map"),
           "/* Generated by cmake/op_table.py from the op table: what libkpool.so exports. */\n"
           "KPOOL_0.1 {\n    global:\n" + "".join(f"        {s};\n" for s in symbols) +
           "    local:\n        *;\n};\n")

    # For the Python package, next to the library it loads.
    python = {"entries": [{k: e[k] for k in ("name", "symbol", "arguments", "returns", "exec", "status",
                                             "torch_extension")} for e in table["entries"]],
              "torch": table["torch"]}
    _write(os.path.join(out, "kpool_ops.json"), json.dumps(python, indent=1) + "\n")


def _write_torch_calls(table, out):
    """python/src/torch_calls.c's entry points: the table's entries with a
    torch_extension slot, tensors then int32 parameters each."""
    carried = sorted((e for e in table["entries"] if e["torch_extension"] is not None),
                     key=lambda e: e["torch_extension"])
    if [e["torch_extension"] for e in carried] != list(range(len(carried))):
        raise TableError(f"torch_extension slots are not 0..{len(carried) - 1}: "
                         f"{[(e['name'], e['torch_extension']) for e in carried]}")
    enum = ["/* Generated by cmake/op_table.py from the op table: the entry points of python/src/torch_calls.c,\n"
            " * in the order bind() takes their addresses (the table's torch_extension). */\n",
            "enum entry {\n"] + [f"    CALL_{e['name']},\n" for e in carried] + ["    ENTRIES\n};\n"]
    _write(os.path.join(out, "kpool_torch_call_entries.h"), "".join(enum))
    specs = ["/* Generated by cmake/op_table.py from the op table: each entry point's spec, its call and its\n"
             " * function (python/src/torch_calls.c). */\n"]
    cases, methods = [], []
    for e in carried:
        tensors = [a for a in e["arguments"] if a["type"] == "tensor"]
        ints = [a for a in e["arguments"] if a["type"] != "tensor"]
        if e["arguments"] != tensors + ints or any(a["type"] != "int32" for a in ints) or len(tensors) > 8 \
                or len(ints) > 4 or not e["exec"]:
            raise TableError(f"entry {e['name']}: the torch extension takes up to 8 tensors, then up to 4 int32 "
                             f"parameters, then the exec")
        flags = [" | ".join([f for f, on in (("INNER", a["inner"]), ("OUTPUT", a["output"])) if on]) or "0"
                 for a in tensors]
        names = ", ".join(f'"{a["python_name"]}"' for a in tensors)
        int_names = ", ".join(f'"{a["python_name"]}"' for a in ints) or "0"
        specs.append(f"static const op_spec spec_{e['name']} = {{\"{e['name']}\", CALL_{e['name']}, {len(tensors)}, "
                     f"{{{names}}}, {{{', '.join(flags)}}}, {len(ints)}, {{{int_names}}}}};\n")
        c_types = ", ".join([ARGUMENT_TYPES[a["type"]][0] for a in e["arguments"]] +
                            ["const kpool_exec *", "kpool_status *"])
        values = ", ".join([f"a[{i}]" for i in range(len(tensors))] + [f"v[{i}]" for i in range(len(ints))] +
                           ["e", "st"])
        cases.append(f"    case CALL_{e['name']}:\n        return ((kpool_status_code(*)({c_types}))fn)({values});\n")
        doc = f"kpool_{e['name']}({', '.join(a['name'] for a in e['arguments'])})"
        if e["returns"] == "skipped_completions":
            doc += " -> skipped completions"
        methods.append(f"    FASTCALL({e['name']}, \"{doc}\"), \\\n")
    specs.append("static const op_spec *const specs[ENTRIES] = {" +
                 ", ".join(f"&spec_{e['name']}" for e in carried) + "};\n\n")
    specs.append("static kpool_status_code invoke_entry(enum entry entry, void *fn, const kpool_tensor *const *a,\n"
                 "                                      const int32_t *v, const kpool_exec *e, kpool_status *st) {\n"
                 "    switch (entry) {\n" + "".join(cases) + "    case ENTRIES: break;\n    }\n"
                 "    return KPOOL_ERROR_INTERNAL;\n}\n\n")
    for e in carried:
        specs.append(f"static PyObject *{e['name']}(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {{\n"
                     f"    (void)self;\n    return run(&spec_{e['name']}, args, nargs);\n}}\n")
    specs.append("\n#define KPOOL_TORCH_CALL_METHODS \\\n" + "".join(methods) + "\n")
    _write(os.path.join(out, "kpool_torch_call_specs.inc"), "".join(specs))


def write_sources(table, args):
    """CMake: the runtime's and the generators' sources the table names."""
    lines = ["# Generated by cmake/op_table.py from the op table: its sources.\n", "set(KPOOL_OP_RUNTIME_SOURCES\n"]
    lines += [f"    {_quote(s)}\n" for o in table["files"] for s in o["runtime_sources"]]
    lines.append(")\nset(KPOOL_OP_GENERATORS\n")
    lines += [f"    {o['name']}\n" for o in table["files"] if o["generator_sources"]]
    lines.append(")\n")
    for o in table["files"]:
        if o["generator_sources"]:
            lines.append(f"set(KPOOL_OP_GENERATOR_SOURCES_{o['name']}\n")
            lines += [f"    {_quote(s)}\n" for s in o["generator_sources"]]
            lines.append(")\n")
    _write(args.out, "".join(lines))


def _write(path, text):
    """Writes only a change, so that an unchanged table rebuilds nothing."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--device", required=True)
    k.add_argument("--cuda", action="store_true")
    k.add_argument("--axis", action="append", default=[])
    k.add_argument("--candidate")
    k.add_argument("--tune", default="")
    k.add_argument("--kernel-ops", default="")
    k.add_argument("--out", required=True)
    t = sub.add_parser("tables")
    t.add_argument("--out-dir", required=True)
    t.add_argument("--tuning", action="store_true")
    s = sub.add_parser("sources")
    s.add_argument("--out", required=True)
    for p in (k, t, s):
        p.add_argument("--table", action="append", required=True)
    args = parser.parse_args(argv)
    try:
        table = load(args.table)
        {"kernels": write_kernels, "tables": write_tables, "sources": write_sources}[args.command](table, args)
    except TableError as e:
        print(f"op table: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

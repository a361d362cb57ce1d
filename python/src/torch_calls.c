/* kpool._torch_calls: the C API called straight from torch tensors, for the
 * per-call host time of the Python package (python/kpool/_calls.py picks it
 * over the ctypes path when it loads).
 *
 * Built against Python's limited API of 3.11 (abi3), so one binary serves
 * every CPython >= 3.11, and without torch's headers: a plain tensor is read
 * through torch's C shim once bind_tensor_shim() has checked it (below),
 * any other through its Python interface (dtype, shape, stride(),
 * data_ptr(), is_cuda, get_device()); the dtypes, the current-stream getter,
 * the shim's addresses and the error types come from the package. The entry
 * points are not linked either: bind() receives their addresses from the
 * libkpool.so the package loaded, so both paths always run the same library.
 *
 * Each function mirrors its kpool_* entry point, tensors and int parameters
 * in the C order, then optionally the call's kpool_arithmetic (prepare():
 * every function takes it, KPOOL_ARITHMETIC_DEFAULT when left out); the C
 * API validates everything. What is checked here is
 * only what a descriptor cannot carry: a dtype kpool has no code for, more
 * than KPOOL_MAX_DIMS dims, a device other than cpu / cuda, an int outside
 * int32.
 */
#ifndef Py_LIMITED_API /* CMake's Python3_add_library(USE_SABI 3.11) defines it too */
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kpool/kpool.h"

/* --- what bind() hands over ---------------------------------------------- */
#define KPOOL_DTYPES 7

/* The entry points this extension calls (enum entry, generated from the op
 * table by the build: its entries with a torch_extension slot). */
#include "kpool_torch_call_entries.h"

static void *entry_points[ENTRIES];
static PyObject *torch_dtypes[KPOOL_DTYPES]; /* indexed by kpool_dtype; NULL: none in this torch */
static PyObject *current_stream;             /* torch._C._cuda_getCurrentRawStream(index) -> int */
static PyObject *error_for;                  /* (code, message) -> KpoolError */
static PyObject *type_error, *value_error, *runtime_error;

/* Each CUDA device's index-error words (kpool.set_index_errors): the
 * tensors, held here so that their memory outlives every call that was
 * given it, and their addresses by device index. */
#define MAX_INDEX_ERROR_DEVICES 64
static PyObject *index_words;
static int32_t *index_words_at[MAX_INDEX_ERROR_DEVICES];

static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_is_cuda, *s_is_cpu, *s_get_device,
    *s_contiguous, *s_cdata;

/* --- one call's descriptors ---------------------------------------------- */
enum { INNER = 1, OUTPUT = 2 };

#define MAX_TENSORS 8

typedef struct {
    kpool_tensor desc[MAX_TENSORS];
    const kpool_tensor *arg[MAX_TENSORS]; /* NULL for None */
    PyObject *copies[MAX_TENSORS];        /* contiguous copies of inputs the kernels cannot address */
    int cuda_index;                       /* device of the first CUDA tensor, -1: host call */
    kpool_exec exec;
} call;

static void release(call *c) {
    for (int i = 0; i < MAX_TENSORS; i++) Py_CLEAR(c->copies[i]);
}

static int raise_formatted(PyObject *type, const char *format, const char *name, long long value) {
    PyObject *text = PyUnicode_FromFormat(format, name, value);
    if (text) {
        PyErr_SetObject(type, text);
        Py_DECREF(text);
    }
    return -1;
}

/* The runtime can address a layout as it is: positive strides on every
 * dimension of more than one element, and a unit innermost stride where
 * the kernels read rows (INNER). */
static int addressable(const kpool_tensor *d, int flags) {
    for (int i = 0; i < d->ndim; i++)
        if (d->shape[i] > 1 && d->strides[i] <= 0) return 0;
    if ((flags & INNER) && d->ndim && d->shape[d->ndim - 1] > 1 && d->strides[d->ndim - 1] != 1) return 0;
    return 1;
}

static int read_ints(PyObject *tuple, int64_t *out, int n) {
    for (int i = 0; i < n; i++) {
        PyObject *item = PyTuple_GetItem(tuple, i); /* borrowed */
        if (!item) return -1;
        out[i] = PyLong_AsLongLong(item);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int read_layout(PyObject *t, kpool_tensor *d) {
    PyObject *strides = PyObject_CallMethodObjArgs(t, s_stride, NULL);
    if (!strides) return -1;
    int rc = read_ints(strides, d->strides, d->ndim);
    Py_DECREF(strides);
    if (rc) return -1;
    PyObject *ptr = PyObject_CallMethodObjArgs(t, s_data_ptr, NULL);
    if (!ptr) return -1;
    d->data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* --- reading a tensor without its Python interface ------------------------
 * torch's C shim (torch/csrc/inductor/aoti_torch/c/shim.h, the stable C
 * API libtorch_cpu exports for compiled models) reads an at::Tensor's
 * dtype, sizes, strides, data and device in a few ns each, where the Python
 * interface costs a method call and a new tuple or int per field. Its
 * handle is the address of the at::Tensor, which a torch.Tensor object
 * holds right after its PyObject header (THPVariable in
 * torch/csrc/autograd/python_variable.h). bind_tensor_shim() turns this on
 * only after checking on probe tensors that the word there is the
 * TensorImpl address torch reports (Tensor._cdata) and that every field
 * the shim reads matches the Python interface; a tensor it cannot read
 * (a subclass, a layout or device kpool does not take) goes through the
 * Python interface, which also names what is wrong with it. */
typedef int32_t (*shim_i32)(void *tensor, int32_t *out);
typedef int32_t (*shim_i64)(void *tensor, int64_t *out);
typedef int32_t (*shim_array)(void *tensor, int64_t **out);
typedef int32_t (*shim_ptr)(void *tensor, void **out);

static struct {
    shim_i32 get_dtype, get_layout, get_device_type, get_device_index;
    shim_i64 get_dim;
    shim_array get_sizes, get_strides;
    shim_ptr get_data_ptr;
    /* aoti_torch_get_current_cuda_stream (libtorch_cuda), or NULL: used on
     * a device once it has given the stream torch's getter gives there */
    int32_t (*get_current_stream)(int32_t device_index, void **stream);
    uint64_t stream_agreed; /* bit i: checked on cuda:i */
    int32_t dtypes[KPOOL_DTYPES]; /* the shim's code of each kpool_dtype; -1: none */
    int32_t strided, cpu, cuda;   /* its codes of the strided layout and the two devices */
    PyObject *tensor_type;        /* torch.Tensor itself: subclasses take the Python interface */
    /* Outputs allocated here (the *_new functions below), once
     * bind_output_allocator() has checked them: aoti_torch_empty_strided,
     * aoti_torch_delete_tensor_object, and
     * torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs, which turns
     * the at::Tensors it returns (in capsules) into torch.Tensors. */
    int32_t (*empty_strided)(int64_t ndim, const int64_t *sizes, const int64_t *strides, int32_t dtype,
                             int32_t device_type, int32_t device_index, void **tensor);
    int32_t (*delete_tensor)(void *tensor);
    PyObject *steal;
} shim;

/* 1: *d holds t's dtype, shape, strides, data and device, read through the
 * shim; 0: t takes the Python interface. */
static int read_native(PyObject *t, kpool_tensor *d) {
    if (!shim.tensor_type || (PyObject *)Py_TYPE(t) != shim.tensor_type) return 0;
    void *h = (char *)t + sizeof(PyObject);
    int32_t dtype, layout, device_type, device_index;
    int64_t ndim, *sizes, *strides;
    void *data;
    if (shim.get_layout(h, &layout) || layout != shim.strided || shim.get_dtype(h, &dtype) ||
        shim.get_dim(h, &ndim) || ndim > KPOOL_MAX_DIMS || shim.get_device_type(h, &device_type) ||
        (device_type != shim.cpu && device_type != shim.cuda) || shim.get_device_index(h, &device_index) ||
        shim.get_sizes(h, &sizes) || shim.get_strides(h, &strides) || shim.get_data_ptr(h, &data))
        return 0;
    int code = -1;
    for (int k = 0; k < KPOOL_DTYPES; k++)
        if (shim.dtypes[k] == dtype) code = k;
    if (code < 0) return 0;
    d->dtype = (kpool_dtype)code;
    d->ndim = (int32_t)ndim;
    for (int k = 0; k < d->ndim; k++) {
        d->shape[k] = sizes[k];
        d->strides[k] = strides[k];
    }
    d->data = data;
    d->device = device_type == shim.cuda ? KPOOL_DEVICE_CUDA : KPOOL_DEVICE_CPU;
    d->device_index = device_type == shim.cuda ? device_index : 0;
    return 1;
}

/* The error for an argument that is no torch tensor (a list, a numpy array
 * among torch tensors, ...): found only after the fast path failed. */
static int not_a_tensor(PyObject *t, const char *name) {
    PyObject *type_name = PyType_GetName(Py_TYPE(t));
    if (!type_name) return -1;
    PyObject *text = PyUnicode_FromFormat("%s is a %U, expected a torch.Tensor (this call's tensors are torch "
                                          "tensors)", name, type_name);
    Py_DECREF(type_name);
    if (text) {
        PyErr_SetObject(type_error, text);
        Py_DECREF(text);
    }
    return -1;
}

/* t's dtype, shape, strides, data and device through its Python interface;
 * -1 with an error naming the argument when kpool cannot take it. */
static int read_python(PyObject *t, kpool_tensor *d, const char *name) {
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    if (!dtype) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return not_a_tensor(t, name);
    }
    int code = -1;
    for (int k = 0; k < KPOOL_DTYPES; k++)
        if (torch_dtypes[k] == dtype) code = k;
    if (code < 0) {
        /* torch.int32's type is torch.dtype: anything else is not a torch tensor's */
        if (Py_TYPE(dtype) != Py_TYPE(torch_dtypes[KPOOL_DTYPE_INT32])) {
            Py_DECREF(dtype);
            return not_a_tensor(t, name);
        }
        PyObject *text = PyUnicode_FromFormat("%s has dtype %S, which kpool does not take", name, dtype);
        Py_DECREF(dtype);
        if (text) {
            PyErr_SetObject(type_error, text);
            Py_DECREF(text);
        }
        return -1;
    }
    Py_DECREF(dtype);
    d->dtype = (kpool_dtype)code;

    PyObject *shape = PyObject_GetAttr(t, s_shape);
    if (!shape) return -1;
    Py_ssize_t ndim = PyTuple_Size(shape);
    if (ndim < 0 || ndim > KPOOL_MAX_DIMS) {
        Py_DECREF(shape);
        return ndim < 0 ? -1 : raise_formatted(value_error, "%s has %lld dims (at most 4)", name, ndim);
    }
    d->ndim = (int32_t)ndim;
    int rc = read_ints(shape, d->shape, d->ndim);
    Py_DECREF(shape);
    if (rc || read_layout(t, d)) return -1;

    PyObject *is_cuda = PyObject_GetAttr(t, s_is_cuda);
    if (!is_cuda) return -1;
    int cuda = PyObject_IsTrue(is_cuda);
    Py_DECREF(is_cuda);
    if (cuda) {
        PyObject *index = PyObject_CallMethodObjArgs(t, s_get_device, NULL);
        if (!index) return -1;
        d->device = KPOOL_DEVICE_CUDA;
        d->device_index = (int32_t)PyLong_AsLong(index);
        Py_DECREF(index);
    } else {
        PyObject *is_cpu = PyObject_GetAttr(t, s_is_cpu);
        if (!is_cpu) return -1;
        int cpu = PyObject_IsTrue(is_cpu);
        Py_DECREF(is_cpu);
        if (!cpu) {
            PyObject *text = PyUnicode_FromFormat("%s is not on a cpu or cuda device; kpool runs on cpu and cuda "
                                                  "tensors", name);
            if (text) {
                PyErr_SetObject(runtime_error, text);
                Py_DECREF(text);
            }
            return -1;
        }
        d->device = KPOOL_DEVICE_CPU;
        d->device_index = 0;
    }
    return 0;
}

static int describe(call *c, int i, PyObject *t, const char *name, int flags) {
    if (t == Py_None) {
        c->arg[i] = NULL;
        return 0;
    }
    kpool_tensor *d = &c->desc[i];
    if (!read_native(t, d) && read_python(t, d, name)) return -1;

    int64_t numel = 1;
    for (int k = 0; k < d->ndim; k++) numel *= d->shape[k];
    if (numel == 0) { /* addresses nothing: row-major strides, which the layout checks accept */
        int64_t step = 1;
        for (int k = d->ndim - 1; k >= 0; k--) {
            d->strides[k] = step;
            step *= d->shape[k] > 1 ? d->shape[k] : 1;
        }
    } else if (!(flags & OUTPUT) && !addressable(d, flags)) {
        /* as the reference's .contiguous(); outputs are always written in place */
        PyObject *copy = PyObject_CallMethodObjArgs(t, s_contiguous, NULL);
        if (!copy) return -1;
        c->copies[i] = copy;
        if (read_layout(copy, d)) return -1;
    }
    if (d->device == KPOOL_DEVICE_CUDA && c->cuda_index < 0) c->cuda_index = d->device_index;
    c->arg[i] = d;
    return 0;
}

static int int32_arg(PyObject *v, const char *name, int32_t *out) {
    long long i = PyLong_AsLongLong(v);
    if (i == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        PyObject *text = PyUnicode_FromFormat("%s = %R is not an int", name, v);
        if (text) {
            PyErr_SetObject(type_error, text);
            Py_DECREF(text);
        }
        return -1;
    }
    if (i < INT32_MIN || i > INT32_MAX)
        return raise_formatted(value_error, "%s = %lld is out of range [-2147483648, 2147483647]", name, i);
    *out = (int32_t)i;
    return 0;
}

/* The kpool_exec of a call (its arithmetic already set): torch's current
 * stream on the device of its first CUDA tensor (NULL for host calls), and
 * that device's index-error words. */
static int prepare_exec(call *c) {
    c->exec.stream = NULL;
    c->exec.index_errors = NULL;
    if (c->cuda_index < 0) return 0;
    const uint64_t bit = c->cuda_index < 64 ? (uint64_t)1 << c->cuda_index : 0;
    if (shim.get_current_stream && (shim.stream_agreed & bit)) {
        if (shim.get_current_stream(c->cuda_index, &c->exec.stream) == 0) goto stream_read;
        shim.get_current_stream = NULL;
    }
    PyObject *stream = PyObject_CallFunction(current_stream, "i", c->cuda_index);
    if (!stream) return -1;
    c->exec.stream = PyLong_AsVoidPtr(stream);
    Py_DECREF(stream);
    if (PyErr_Occurred()) return -1;
    if (shim.get_current_stream && bit) { /* first call on this device: the shim must agree to be used */
        void *from_shim = NULL;
        if (shim.get_current_stream(c->cuda_index, &from_shim) == 0 && from_shim == c->exec.stream)
            shim.stream_agreed |= bit;
        else
            shim.get_current_stream = NULL;
    }
stream_read:
    if (c->cuda_index < MAX_INDEX_ERROR_DEVICES) c->exec.index_errors = index_words_at[c->cuda_index];
    return 0;
}

static PyObject *finish(kpool_status_code code, const kpool_status *status) {
    if (code == KPOOL_OK) return NULL;
    PyObject *error = PyObject_CallFunction(error_for, "is", (int)code, status->message);
    if (error) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
}

/* --- the entry points, one spec each --------------------------------------- */
typedef struct {
    const char *name;
    enum entry entry;
    int tensors;
    const char *tensor_names[MAX_TENSORS];
    int flags[MAX_TENSORS];
    int ints;
    const char *int_names[4];
} op_spec;

static kpool_status_code invoke_entry(enum entry entry, void *fn, const kpool_tensor *const *a,
                                      const int32_t *v, const kpool_exec *e, kpool_status *st);

static kpool_status_code invoke(const op_spec *op, call *c, const int32_t *v, kpool_status *st) {
    return invoke_entry(op->entry, entry_points[op->entry], c->arg, v, &c->exec, st);
}

/* Whether a function given nargs arguments has an op's `count`, and
 * perhaps the arithmetic after them. */
#define TAKES(nargs, count) ((nargs) == (count) || (nargs) == (count) + 1)

/* Describes a call from Python arguments (tensors or None, then ints, then
 * optionally the arithmetic) into *c and values; -1 with an exception set
 * on a bad argument. The arithmetic is each call's own: one thread's
 * calls never see another's. */
static int prepare(const op_spec *op, PyObject *const *args, Py_ssize_t nargs, call *c, int32_t *values) {
    memset(c, 0, sizeof *c);
    c->cuda_index = -1;
    if (!entry_points[op->entry]) {
        PyErr_SetString(PyExc_RuntimeError, "kpool._torch_calls: bind() was not called");
        return -1;
    }
    const int count = op->tensors + op->ints;
    if (!TAKES(nargs, count)) {
        PyErr_Format(PyExc_TypeError, "%s takes %d arguments, then optionally the arithmetic (%zd given)", op->name,
                     count, nargs);
        return -1;
    }
    for (int i = 0; i < op->tensors; i++)
        if (describe(c, i, args[i], op->tensor_names[i], op->flags[i])) return -1;
    for (int i = 0; i < op->ints; i++)
        if (int32_arg(args[op->tensors + i], op->int_names[i], &values[i])) return -1;
    c->exec.arithmetic = KPOOL_ARITHMETIC_DEFAULT;
    if (nargs > count && int32_arg(args[count], "arithmetic", &c->exec.arithmetic)) return -1;
    return prepare_exec(c);
}

/* Runs one entry point on Python arguments: tensors (or None), then ints.
 * Returns decode's skipped completions (0 for the other ops). */
static PyObject *run(const op_spec *op, PyObject *const *args, Py_ssize_t nargs) {
    call c;
    int32_t values[4];
    kpool_status status;
    status.message[0] = 0;
    status.skipped_completions = 0;
    PyObject *result = NULL;
    if (prepare(op, args, nargs, &c, values)) goto done;
    kpool_status_code code;
    Py_BEGIN_ALLOW_THREADS
    code = invoke(op, &c, values, &status);
    Py_END_ALLOW_THREADS
    result = code == KPOOL_OK ? PyLong_FromLongLong(status.skipped_completions) : finish(code, &status);
done:
    release(&c);
    return result;
}

/* Each entry point's spec (its tensors' names and rules, its parameters),
 * its call and its function, from the op table. */
#include "kpool_torch_call_specs.inc"

/* --- outputs allocated here ------------------------------------------------
 * The torch ops' kernels (python/kpool/_torch_ops.py) allocate their
 * outputs, then call the entry point. The *_new functions do both in one
 * call, the op's arguments without its outputs in, the outputs out: each
 * output is allocated through the shim (aoti_torch_empty_strided, what
 * torch.empty runs below Python: on the device of the input it follows,
 * through torch's caching allocator on CUDA, so a CUDA graph's capture takes
 * it as it takes torch.empty's) and wrapped as a torch.Tensor, in about half
 * the time of a Tensor.new_empty from Python. They return NotImplemented
 * where they do not allocate: bind_output_allocator() not called or its
 * probe failed, the input the outputs follow not a plain tensor the shim
 * reads or not of the dims they are shaped from, an int the sizes cannot be
 * computed from, or an allocation that failed. The caller then allocates
 * in Python, whose checks name what is wrong, and torch raises its own
 * error for an allocation it cannot make. */

#define MAX_OUTPUTS 2
#define MAX_OUTPUT_DIMS 2

typedef struct {
    int count;
    int at[MAX_OUTPUTS]; /* positions among the entry point's arguments */
    int ndim[MAX_OUTPUTS];
    int64_t sizes[MAX_OUTPUTS][MAX_OUTPUT_DIMS];
    kpool_dtype dtype[MAX_OUTPUTS];
} outputs_spec;

/* *d: t read through the shim, when outputs are allocated here and t is a
 * plain tensor of ndim dims. */
static int shaped_like(PyObject *t, int ndim, kpool_tensor *d) {
    return shim.steal && read_native(t, d) && d->ndim == ndim;
}

/* Whether a *_new function was given its op's `count` arguments, then
 * perhaps an int (the arithmetic): else the caller's path names what is
 * wrong. */
static int takes_new(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t count) {
    return nargs == count || (nargs == count + 1 && PyLong_Check(args[count]));
}

/* v as an int32 (an int or a bool), else 0: the caller's path names it. */
static int small_int(PyObject *v, int64_t *out) {
    long long i = PyLong_AsLongLong(v);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = i;
    return i >= INT32_MIN && i <= INT32_MAX;
}

/* out's tensors, new and contiguous on like's device (torch's strides: each
 * the product of the later sizes, a size 0 counted as 1), into tensors[]:
 * 1; 0 with no error set when the shim cannot make them; -1 with an error
 * when wrapping them failed. The list form of torch's stealing function
 * takes over the at::Tensor handles (moves each into its torch.Tensor and
 * deletes the handle), one call for all outputs. */
static int new_outputs(const kpool_tensor *like, const outputs_spec *out, PyObject **tensors) {
    const int cuda = like->device == KPOOL_DEVICE_CUDA;
    void *handles[MAX_OUTPUTS] = {NULL, NULL};
    PyObject *capsules = PyList_New(out->count);
    int made = capsules ? 1 : -1;
    for (int i = 0; i < out->count && made == 1; i++) {
        int64_t strides[MAX_OUTPUT_DIMS];
        int64_t step = 1;
        for (int k = out->ndim[i] - 1; k >= 0; k--) {
            strides[k] = step;
            step *= out->sizes[i][k] > 1 ? out->sizes[i][k] : 1;
        }
        if (shim.empty_strided(out->ndim[i], out->sizes[i], strides, shim.dtypes[out->dtype[i]],
                               cuda ? shim.cuda : shim.cpu, cuda ? like->device_index : -1, &handles[i]) ||
            !handles[i]) {
            handles[i] = NULL;
            made = 0;
            break;
        }
        PyObject *capsule = PyCapsule_New(handles[i], NULL, NULL);
        if (!capsule) made = -1;
        else PyList_SetItem(capsules, i, capsule); /* steals the capsule */
    }
    PyObject *list = made == 1 ? PyObject_CallFunctionObjArgs(shim.steal, capsules, NULL) : NULL;
    Py_XDECREF(capsules);
    if (!list) { /* the handles were not taken over */
        for (int i = 0; i < out->count; i++)
            if (handles[i]) shim.delete_tensor(handles[i]);
        return made == 1 ? -1 : made;
    }
    if (!PyList_Check(list) || PyList_Size(list) != out->count) { /* bind_output_allocator's probe saw a list */
        Py_DECREF(list);
        PyErr_SetString(runtime_error, "kpool: torch's stealing function returned no list of the outputs");
        return -1;
    }
    for (int i = 0; i < out->count; i++) tensors[i] = Py_NewRef(PyList_GetItem(list, i));
    Py_DECREF(list);
    return 1;
}

/* Allocates the outputs, runs op on args with them inserted, returns them
 * (one, or a tuple). */
static PyObject *run_new(const op_spec *op, PyObject *const *args, Py_ssize_t nargs, const kpool_tensor *like,
                         const outputs_spec *out) {
    PyObject *tensors[MAX_OUTPUTS] = {NULL, NULL};
    PyObject *full[MAX_TENSORS + 4 + 1]; /* tensors, ints, the arithmetic */
    const int made = new_outputs(like, out, tensors);
    if (made <= 0) {
        if (made < 0) return NULL;
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = NULL;
    for (Py_ssize_t i = 0, from = 0, o = 0; i < nargs + out->count; i++)
        full[i] = o < out->count && out->at[o] == i ? tensors[o++] : args[from++];
    PyObject *skipped = run(op, full, nargs + out->count);
    if (skipped) {
        Py_DECREF(skipped);
        result = out->count == 1 ? Py_NewRef(tensors[0]) : PyTuple_Pack(2, tensors[0], tensors[1]);
    }
    for (int i = 0; i < out->count; i++) Py_DECREF(tensors[i]);
    return result;
}

/* The quantized rows fwht and compress return: [rows, 128] e4m3 codes at
 * position `at` among the entry point's arguments, then their f32 scales
 * ([rows, 1] or [rows]: scale_ndim), rows the first dim of args[like]. */
static PyObject *quantized_rows_new(const op_spec *op, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                                    int like, int like_ndim, int at, int scale_ndim) {
    kpool_tensor t;
    if (!takes_new(args, nargs, want) || !shaped_like(args[like], like_ndim, &t)) Py_RETURN_NOTIMPLEMENTED;
    const outputs_spec out = {2, {at, at + 1}, {2, scale_ndim}, {{t.shape[0], KPOOL_HEAD_DIM}, {t.shape[0], 1}},
                              {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_FLOAT32}};
    return run_new(op, args, nargs, &t, &out);
}

/* fwht128_quant_fp8_new(q) -> (q_fp8 [rows, 128] e4m3, q_scale [rows, 1] f32) */
static PyObject *fwht128_quant_fp8_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return quantized_rows_new(&spec_fwht128_quant_fp8, args, nargs, 1, 0, 2, 1, 2);
}

/* compress_and_write_cache_new(kv_cache, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim,
 * round_scale, write_cache) -> (compressed_k [n, 128] e4m3, compressed_scale [n] f32) */
static PyObject *compress_and_write_cache_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return quantized_rows_new(&spec_compress_and_write_cache, args, nargs, 10, 1, 3, 6, 1);
}

/* The int32 token ids [rows, max(cols, 0)] the top-k helpers return, at
 * position `at` among the entry point's arguments, rows those of like. */
static PyObject *token_ids_new(const op_spec *op, PyObject *const *args, Py_ssize_t nargs, const kpool_tensor *like,
                               int at, int64_t cols) {
    const outputs_spec out = {1, {at}, {2}, {{like->shape[0], cols > 0 ? cols : 0}}, {KPOOL_DTYPE_INT32}};
    return run_new(op, args, nargs, like, &out);
}

/* expand_pools_and_append_tail_new(pool_ids, seq_lens, pool_size, bound_pool_ids)
 * -> out [rows, max(G * P + P - 1, 0)] int32 */
static PyObject *expand_pools_and_append_tail_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    kpool_tensor ids;
    int64_t pool_size, cols;
    if (!takes_new(args, nargs, 4) || !shaped_like(args[0], 2, &ids) || !small_int(args[2], &pool_size) ||
        __builtin_mul_overflow(ids.shape[1], pool_size, &cols) || __builtin_add_overflow(cols, pool_size - 1, &cols))
        Py_RETURN_NOTIMPLEMENTED;
    return token_ids_new(&spec_expand_pools_and_append_tail, args, nargs, &ids, 2, cols);
}

/* expand_pools_to_tokens_new(group_ids, group_valid, page_table, topk_offsets, topk, pool_size)
 * -> out [rows, max(topk, 0)] int32 */
static PyObject *expand_pools_to_tokens_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    kpool_tensor ids;
    int64_t topk;
    if (!takes_new(args, nargs, 6) || !shaped_like(args[0], 2, &ids) || !small_int(args[4], &topk)) Py_RETURN_NOTIMPLEMENTED;
    return token_ids_new(&spec_expand_pools_to_tokens, args, nargs, &ids, 4, topk);
}

/* append_tail_to_topk_new(topk_result, seq_lens, pool_lens, page_table, topk_offsets, pool_size)
 * -> out [rows, max(C + P - 1, 0)] int32 */
static PyObject *append_tail_to_topk_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    kpool_tensor result;
    int64_t pool_size, cols;
    if (!takes_new(args, nargs, 6) || !shaped_like(args[0], 2, &result) || !small_int(args[5], &pool_size) ||
        __builtin_add_overflow(result.shape[1], pool_size - 1, &cols))
        Py_RETURN_NOTIMPLEMENTED;
    return token_ids_new(&spec_append_tail_to_topk, args, nargs, &result, 5, cols);
}

/* time_calls(name, calls, thread_clock, *arguments): the entry point of
 * function `name` (one of the above, same arguments) called `calls` times
 * back to back on descriptors read once, without the GIL; returns the
 * seconds per call, of wall time, or of this thread's CPU time when
 * thread_clock (steadier on a loaded machine). It is the C API's share of
 * a call from Python: bench/host_overhead.py prints it next to the whole
 * call, so the rest is the Python side. */
static PyObject *time_calls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *name = nargs >= 3 ? PyUnicode_AsUTF8AndSize(args[0], NULL) : NULL;
    long calls = nargs >= 3 ? PyLong_AsLong(args[1]) : 0;
    int thread_clock = nargs >= 3 ? PyObject_IsTrue(args[2]) : -1;
    if (!name || calls < 1 || thread_clock < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "time_calls(name, calls >= 1, thread_clock, *arguments)");
        return NULL;
    }
    const clockid_t clock = thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    const op_spec *op = NULL;
    for (int i = 0; i < ENTRIES; i++)
        if (strcmp(specs[i]->name, name) == 0) op = specs[i];
    if (!op) {
        PyErr_Format(PyExc_ValueError, "time_calls: no function %s", name);
        return NULL;
    }
    call c;
    int32_t values[4];
    kpool_status status;
    status.message[0] = 0;
    PyObject *result = NULL;
    if (prepare(op, args + 3, nargs - 3, &c, values)) goto done;
    kpool_status_code code = KPOOL_OK;
    struct timespec start, end;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(clock, &start);
    for (long i = 0; i < calls && code == KPOOL_OK; i++) code = invoke(op, &c, values, &status);
    clock_gettime(clock, &end);
    Py_END_ALLOW_THREADS
    if (code == KPOOL_OK)
        result = PyFloat_FromDouble(((double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec)) /
                                    (double)calls);
    else
        finish(code, &status);
done:
    release(&c);
    return result;
}

static void replace(PyObject **slot, PyObject *value) {
    PyObject *old = *slot;
    Py_XINCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

/* bind(entry_points, dtypes, current_stream, error_for, type_error, value_error, runtime_error):
 * entry_points: the ENTRIES (7) addresses in the order of enum entry; dtypes: 7 torch dtypes (or None) in
 * kpool_dtype order. */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != ENTRIES || !PyTuple_Check(args[1]) ||
        PyTuple_Size(args[1]) != KPOOL_DTYPES) {
        PyErr_SetString(PyExc_TypeError, "bind(entry_points[7], dtypes[7], current_stream, error_for, "
                                         "type_error, value_error, runtime_error)");
        return NULL;
    }
    void *fns[ENTRIES];
    for (int i = 0; i < ENTRIES; i++) {
        fns[i] = PyLong_AsVoidPtr(PyTuple_GetItem(args[0], i));
        if (PyErr_Occurred()) return NULL;
    }
    memcpy(entry_points, fns, sizeof fns);
    for (int i = 0; i < KPOOL_DTYPES; i++) {
        PyObject *dt = PyTuple_GetItem(args[1], i);
        replace(&torch_dtypes[i], dt == Py_None ? NULL : dt);
    }
    replace(&current_stream, args[2]);
    replace(&error_for, args[3]);
    replace(&type_error, args[4]);
    replace(&value_error, args[5]);
    replace(&runtime_error, args[6]);
    Py_RETURN_NONE;
}

/* Whether the shim reads `probe` as its Python interface does, and the
 * word after the object's header is the TensorImpl address torch reports. */
static int shim_agrees(PyObject *probe) {
    PyObject *cdata = PyObject_GetAttr(probe, s_cdata);
    if (!cdata) return -1;
    void *impl = PyLong_AsVoidPtr(cdata);
    Py_DECREF(cdata);
    if (PyErr_Occurred()) return -1;
    if (*(void **)((char *)probe + sizeof(PyObject)) != impl) return 0;
    kpool_tensor native, python;
    memset(&native, 0, sizeof native);
    memset(&python, 0, sizeof python);
    if (!read_native(probe, &native)) return 0;
    if (read_python(probe, &python, "probe")) return -1;
    return memcmp(&native, &python, sizeof native) == 0;
}

/* bind_tensor_shim(getters, dtypes, codes, tensor_type, probes) -> bool:
 * getters: the addresses of aoti_torch_get_{dtype, layout, device_type,
 * device_index, dim, sizes, strides, data_ptr}; dtypes: the shim's code of
 * each kpool_dtype (-1: none); codes: (strided layout, cpu, cuda);
 * tensor_type: torch.Tensor; probes: tensors to check the reads on;
 * current_stream: the address of aoti_torch_get_current_cuda_stream, or 0.
 * Returns whether tensors are read through the shim from now on (False
 * when a probe disagrees). bind_tensor_shim(None): never. */
static PyObject *bind_tensor_shim(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    replace(&shim.tensor_type, NULL);
    shim.get_current_stream = NULL;
    if (nargs == 1 && args[0] == Py_None) Py_RETURN_FALSE;
    if (nargs != 6 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != 8 || !PyTuple_Check(args[1]) ||
        PyTuple_Size(args[1]) != KPOOL_DTYPES || !PyTuple_Check(args[2]) || PyTuple_Size(args[2]) != 3 ||
        !PyType_Check(args[3]) || !PyList_Check(args[4]) || PyList_Size(args[4]) < 1) {
        PyErr_SetString(PyExc_TypeError, "bind_tensor_shim(getters[8], dtypes[7], (strided, cpu, cuda), "
                                         "torch.Tensor, [probe tensors], current_stream) or "
                                         "bind_tensor_shim(None)");
        return NULL;
    }
    void *getters[8];
    for (int i = 0; i < 8; i++) {
        getters[i] = PyLong_AsVoidPtr(PyTuple_GetItem(args[0], i));
        if (PyErr_Occurred()) return NULL;
        if (!getters[i]) Py_RETURN_FALSE;
    }
    int64_t codes[KPOOL_DTYPES + 3];
    for (int i = 0; i < KPOOL_DTYPES + 3; i++) {
        codes[i] = PyLong_AsLongLong(PyTuple_GetItem(i < KPOOL_DTYPES ? args[1] : args[2],
                                                     i < KPOOL_DTYPES ? i : i - KPOOL_DTYPES));
        if (PyErr_Occurred()) return NULL;
    }
    shim.get_dtype = (shim_i32)getters[0];
    shim.get_layout = (shim_i32)getters[1];
    shim.get_device_type = (shim_i32)getters[2];
    shim.get_device_index = (shim_i32)getters[3];
    shim.get_dim = (shim_i64)getters[4];
    shim.get_sizes = (shim_array)getters[5];
    shim.get_strides = (shim_array)getters[6];
    shim.get_data_ptr = (shim_ptr)getters[7];
    shim.get_current_stream = (int32_t(*)(int32_t, void **))PyLong_AsVoidPtr(args[5]);
    shim.stream_agreed = 0;
    if (PyErr_Occurred()) return NULL;
    for (int i = 0; i < KPOOL_DTYPES; i++) shim.dtypes[i] = (int32_t)codes[i];
    shim.strided = (int32_t)codes[KPOOL_DTYPES];
    shim.cpu = (int32_t)codes[KPOOL_DTYPES + 1];
    shim.cuda = (int32_t)codes[KPOOL_DTYPES + 2];
    replace(&shim.tensor_type, args[3]);
    for (Py_ssize_t i = 0; i < PyList_Size(args[4]); i++) {
        int agrees = shim_agrees(PyList_GetItem(args[4], i));
        if (agrees <= 0) {
            replace(&shim.tensor_type, NULL);
            shim.get_current_stream = NULL;
            if (agrees < 0) return NULL;
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

/* bind_output_allocator(empty_strided, delete_tensor_object, steal) -> bool:
 * the addresses of aoti_torch_empty_strided and
 * aoti_torch_delete_tensor_object, and
 * torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs. Turns the *_new
 * functions on once the shim reads tensors (bind_tensor_shim) and a probe
 * allocated through them reads back as the torch.Tensor asked for; returns
 * whether they allocate. bind_output_allocator(None): never. */
static PyObject *bind_output_allocator(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    replace(&shim.steal, NULL);
    if (nargs == 1 && args[0] == Py_None) Py_RETURN_FALSE;
    if (nargs != 3 || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "bind_output_allocator(empty_strided, delete_tensor_object, steal) or "
                                         "bind_output_allocator(None)");
        return NULL;
    }
    void *empty_strided = PyLong_AsVoidPtr(args[0]);
    void *delete_tensor = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (!empty_strided || !delete_tensor || !shim.tensor_type) Py_RETURN_FALSE;
    shim.empty_strided = (int32_t(*)(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t,
                                     void **))empty_strided;
    shim.delete_tensor = (int32_t(*)(void *))delete_tensor;
    replace(&shim.steal, args[2]);
    /* the probe: an int32 [3, 5] on the CPU, read back through the shim, held by its torch.Tensor alone
     * (a stealing function that copied the at::Tensor without deleting the handle would leak each output) */
    kpool_tensor like, probe;
    memset(&like, 0, sizeof like);
    memset(&probe, 0, sizeof probe);
    like.device = KPOOL_DEVICE_CPU;
    const outputs_spec out = {1, {0}, {2}, {{3, 5}}, {KPOOL_DTYPE_INT32}};
    PyObject *tensor = NULL;
    if (new_outputs(&like, &out, &tensor) <= 0) { /* a torch whose functions take other arguments */
        replace(&shim.steal, NULL);
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    PyObject *uses = PyObject_CallMethod(tensor, "_use_count", NULL);
    const long use_count = uses ? PyLong_AsLong(uses) : -1;
    Py_XDECREF(uses);
    PyErr_Clear();
    const int agrees = use_count == 1 && read_native(tensor, &probe) && probe.dtype == KPOOL_DTYPE_INT32 &&
                       probe.ndim == 2 && probe.shape[0] == 3 && probe.shape[1] == 5 && probe.strides[0] == 5 &&
                       probe.strides[1] == 1 && probe.device == KPOOL_DEVICE_CPU && probe.data;
    Py_DECREF(tensor);
    if (!agrees) replace(&shim.steal, NULL);
    return PyBool_FromLong(agrees);
}

/* set_index_errors(words, addresses): the index-error words of later
 * calls, a tuple of tensors (or None) by CUDA device index, and their
 * addresses. The tensors are held until the next set_index_errors. */
static PyObject *set_index_errors(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
        PyTuple_Size(args[0]) != PyTuple_Size(args[1]) || PyTuple_Size(args[0]) > MAX_INDEX_ERROR_DEVICES) {
        PyErr_Format(PyExc_TypeError, "set_index_errors(words, addresses): two tuples of one length, at most %d",
                     MAX_INDEX_ERROR_DEVICES);
        return NULL;
    }
    int32_t *at[MAX_INDEX_ERROR_DEVICES] = {NULL};
    for (Py_ssize_t i = 0; i < PyTuple_Size(args[1]); i++) {
        at[i] = (int32_t *)PyLong_AsVoidPtr(PyTuple_GetItem(args[1], i));
        if (PyErr_Occurred()) return NULL;
    }
    replace(&index_words, args[0]);
    memcpy(index_words_at, at, sizeof at);
    Py_RETURN_NONE;
}

#define FASTCALL(fn, doc) {#fn, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, doc}
static PyMethodDef methods[] = {
    FASTCALL(bind, "Hands over the library's entry points, torch's dtypes, its stream getter and kpool's errors."),
    FASTCALL(set_index_errors, "Sets (and holds) each CUDA device's index-error words for later calls."),
    FASTCALL(bind_tensor_shim, "Reads tensors through torch's C shim when it agrees with the Python interface."),
    FASTCALL(bind_output_allocator, "Allocates the *_new functions' outputs through torch's C shim once a probe "
                                    "agrees."),
    FASTCALL(time_calls, "time_calls(name, calls, thread_clock, *arguments) -> seconds per call of the entry point "
                         "alone"),
    KPOOL_TORCH_CALL_METHODS
    FASTCALL(fwht128_quant_fp8_new, "fwht128_quant_fp8_new(q) -> (q_fp8, q_scale), or NotImplemented"),
    FASTCALL(compress_and_write_cache_new,
             "compress_and_write_cache_new(kv_cache, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim, "
             "round_scale, write_cache) -> (compressed_k, compressed_scale), or NotImplemented"),
    FASTCALL(expand_pools_and_append_tail_new,
             "expand_pools_and_append_tail_new(pool_ids, seq_lens, pool_size, bound_pool_ids) -> out, or "
             "NotImplemented"),
    FASTCALL(expand_pools_to_tokens_new, "expand_pools_to_tokens_new(group_ids, group_valid, page_table, "
                                         "topk_offsets, topk, pool_size) -> out, or NotImplemented"),
    FASTCALL(append_tail_to_topk_new, "append_tail_to_topk_new(topk_result, seq_lens, pool_lens, page_table, "
                                      "topk_offsets, pool_size) -> out, or NotImplemented"),
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_calls",
                                    "libkpool.so's entry points called from torch tensors (see torch_calls.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__torch_calls(void) {
#define INTERN(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return NULL;
    INTERN(s_dtype, "dtype")
    INTERN(s_shape, "shape")
    INTERN(s_stride, "stride")
    INTERN(s_data_ptr, "data_ptr")
    INTERN(s_is_cuda, "is_cuda")
    INTERN(s_is_cpu, "is_cpu")
    INTERN(s_get_device, "get_device")
    INTERN(s_contiguous, "contiguous")
    INTERN(s_cdata, "_cdata")
#undef INTERN
    return PyModule_Create(&module);
}

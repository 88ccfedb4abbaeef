/* The built-in MLP policies' arithmetic, compiled (rlfleet.policies._mlp_kernel).
 *
 * Every value is the one tests/mlp_reference.py computes, bit for bit: the
 * same IEEE operations in the same order, in float32 (float64 where the
 * reference says so). That is the "Exact arithmetic" contract of
 * docs/policies.md; tests/test_mlp_kernel.py holds the kernel to it. Three
 * rules keep it true on any machine:
 *
 * - No contraction into fused multiply-add and no fast-math: the build passes
 *   -ffp-contract=off (pyproject.toml), a fast-math build does not compile, and the
 *   module refuses to load if a product and a sum were fused anyway.
 * - Vectors (GCC vector extensions, 4 float lanes) only where each lane runs
 *   the reference's scalar sequence for one output; a row's values never mix
 *   across lanes and nothing is reassociated, so every row's bits depend on
 *   that row and the parameters only, whatever the batch around it.
 * - Conditionals on vectors are bit masks, exactly the reference's selects.
 *
 * On a CPU with AVX2 the dense layers and activations run 8 lanes at a time
 * (functions built for that target, chosen once at import): each lane still
 * runs one output's scalar sequence, so the bits are those of 4 lanes; a
 * build with -DRLFLEET_MLP_NARROW keeps 4 lanes everywhere (the test that
 * compares the two builds).
 *
 * A Kernel holds its own copy of one parameter set (never mutated after it is
 * built) and allocates per-call scratch on the stack or the heap, so calls
 * from several threads at once are safe; large batches run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(__GNUC__)
#error "rlfleet's MLP kernel needs GCC or clang (vector extensions)"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "rlfleet's MLP kernel needs float arithmetic in float (FLT_EVAL_METHOD 0, e.g. SSE2 on x86)"
#endif
#ifdef __FAST_MATH__
#error "rlfleet's MLP kernel must not be built with -ffast-math: it reorders float arithmetic"
#endif

#include "_mlp_math.h"

/* ----------------------------------------------------------------- Kernel */

typedef struct {
    PyObject_HEAD
    Py_ssize_t n_layers;
    Layer *layers;
    int activation;
    Py_ssize_t scratch;  /* floats of per-row scratch a call needs */
    const float *log_std; /* Gaussian: the outputs' log_std and exp32(log_std); else NULL */
    const float *std;
    float *memory;        /* everything above, one allocation */
} Kernel;

static PyObject *numpy_empty;  /* numpy.empty, for the outputs */
static PyObject *dtype_f32, *dtype_i64;

/* Whether a buffer's format is the native-order single type code `code`. */
static int has_format(const Py_buffer *view, char code) {
    const char *format = view->format ? view->format : "B";
    if (format[0] == '@' || format[0] == '=' || format[0] == '<') format++;
    return format[0] == code && format[1] == '\0';
}

/* "float64 (3, 1)": a buffer's element type (numpy's name where it has one) and shape. */
static void describe(const Py_buffer *view, char *text, size_t size) {
    static const char codes[] = "fdebBhHiIlLqQ?";
    static const char *names[] = {"float32", "float64", "float16", "int8",   "uint8",
                                  "int16",   "uint16",  "int32",   "uint32", "int64",
                                  "uint64",  "int64",   "uint64",  "bool"};
    const char *format = view->format ? view->format : "B";
    const char *code = format;
    if (*code == '@' || *code == '=' || *code == '<') code++;
    const char *type = NULL;
    if (code[0] != '\0' && code[1] == '\0') {
        const char *at = strchr(codes, code[0]);
        if (at != NULL) type = names[at - codes];
    }
    int used = type ? snprintf(text, size, "%s (", type) : snprintf(text, size, "format '%.20s' (", format);
    for (int i = 0; i < view->ndim && used > 0 && (size_t)used < size; i++)
        used += snprintf(text + used, size - (size_t)used, i ? ", %zd" : "%zd", view->shape[i]);
    if (used > 0 && (size_t)used < size)
        snprintf(text + used, size - (size_t)used, view->ndim == 1 ? ",)" : ")");
}

/* Reads a float32 array of 1 or 2 dims (any strides) into dense rows of `pitch` floats. */
static int copy_param(PyObject *obj, const char *what, Py_ssize_t index, int ndim,
                      Py_ssize_t rows, Py_ssize_t cols, float *dst, Py_ssize_t pitch) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Format(PyExc_TypeError, "layer %zd %s must be a float32 array, got %.100s", index,
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int ok = has_format(&view, 'f') && view.itemsize == 4 && view.ndim == ndim;
    if (!ok) {
        char got[160];
        describe(&view, got, sizeof got);
        PyErr_Format(PyExc_TypeError, "layer %zd %s must be a %d-d float32 array, got %s", index,
                     what, ndim, got);
    } else if (view.shape[0] != rows || (ndim == 2 && view.shape[1] != cols)) {
        ok = 0;
        if (ndim == 2)
            PyErr_Format(PyExc_ValueError, "layer %zd %s must have shape (%zd, %zd), got (%zd, %zd)",
                         index, what, rows, cols, view.shape[0], view.shape[1]);
        else
            PyErr_Format(PyExc_ValueError, "layer %zd %s must have shape (%zd,), got (%zd,)", index,
                         what, rows, view.shape[0]);
    } else {
        const char *base = (const char *)view.buf;
        Py_ssize_t s0 = view.strides[0], s1 = ndim == 2 ? view.strides[1] : 0;
        for (Py_ssize_t r = 0; r < rows; r++)
            for (Py_ssize_t c = 0; c < (ndim == 2 ? cols : 1); c++)
                memcpy(dst + r * pitch + c, base + r * s0 + c * s1, sizeof(float));
    }
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

/* A buffer's dims (`ndim` of them, 1 or 2) into `dims`: 0, or -1 with an error set. */
static int param_shape(PyObject *obj, const char *what, Py_ssize_t index, int ndim, Py_ssize_t *dims) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "layer %zd %s must be a float32 array, got %.100s", index,
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int ok = view.ndim == ndim;
    if (ok) {
        dims[0] = view.shape[0];
        dims[1] = ndim == 2 ? view.shape[1] : 0;
    } else {
        PyErr_Format(PyExc_ValueError, "layer %zd %s must have %d dims, got %d", index, what, ndim,
                     view.ndim);
    }
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

static const Py_ssize_t MAX_FLOATS = PY_SSIZE_T_MAX / 8; /* keeps every size product in range */

static int Kernel_init(Kernel *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"layers", "activation", "log_std", NULL};
    PyObject *layers_arg, *log_std_arg = Py_None;
    const char *activation;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Os|O:Kernel", keywords, &layers_arg, &activation,
                                     &log_std_arg))
        return -1;
    if (self->memory != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Kernel is built once; make a new one");
        return -1;
    }
    if (strcmp(activation, "tanh") == 0) self->activation = ACT_TANH;
    else if (strcmp(activation, "relu") == 0) self->activation = ACT_RELU;
    else if (strcmp(activation, "identity") == 0) self->activation = ACT_IDENTITY;
    else {
        PyErr_Format(PyExc_ValueError, "activation must be 'tanh', 'relu' or 'identity', got '%s'",
                     activation);
        return -1;
    }
    PyObject *layers = PySequence_Fast(layers_arg, "layers must be a sequence of (weight, bias) pairs");
    if (layers == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(layers);
    int result = -1;
    Layer *specs = NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "layers must hold at least one (weight, bias) pair");
        goto done;
    }
    specs = PyMem_Calloc((size_t)n, sizeof(Layer));
    if (specs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Pass 1: shapes, chaining, sizes. */
    Py_ssize_t floats = 0, widest_in = 0, widest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(layers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "layer %zd must be a (weight, bias) tuple", i);
            goto done;
        }
        Py_ssize_t wdims[2], bdims[2];
        if (param_shape(PyTuple_GET_ITEM(pair, 0), "weight", i, 2, wdims) < 0) goto done;
        if (param_shape(PyTuple_GET_ITEM(pair, 1), "bias", i, 1, bdims) < 0) goto done;
        Py_ssize_t k = wdims[0], h = wdims[1];
        if (h < 1) {
            PyErr_Format(PyExc_ValueError, "layer %zd has no outputs (weight shape (%zd, %zd))", i, k, h);
            goto done;
        }
        if (i > 0 && k != specs[i - 1].out) {
            PyErr_Format(PyExc_ValueError, "layer %zd takes %zd inputs but layer %zd gives %zd", i, k,
                         i - 1, specs[i - 1].out);
            goto done;
        }
        if (k > MAX_FLOATS || h > MAX_FLOATS - LANES) goto too_large;
        Py_ssize_t padded = (h + LANES - 1) / LANES * LANES;
        if (padded > (MAX_FLOATS - floats) / (k + 1)) goto too_large;
        specs[i].in = k;
        specs[i].out = h;
        specs[i].padded = padded;
        floats += (k + 1) * padded;
        if (k > widest_in) widest_in = k;
        if (padded > widest) widest = padded;
    }
    Py_ssize_t out_dim = specs[n - 1].out;
    if (log_std_arg != Py_None) {
        if (out_dim > (MAX_FLOATS - floats) / 2) goto too_large;
        floats += 2 * out_dim;
    }
    /* Room for one call's rows: the input row, two hidden rows and one output row. */
    if (widest > (MAX_FLOATS - specs[0].in) / 3) goto too_large;
    self->scratch = specs[0].in + 3 * widest;
    float *memory = PyMem_Calloc((size_t)floats + 1, sizeof(float));
    if (memory == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Pass 2: copies, zero-padded to whole vectors. */
    float *cursor = memory;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(layers, i);
        Layer *spec = &specs[i];
        if (copy_param(PyTuple_GET_ITEM(pair, 0), "weight", i, 2, spec->in, spec->out, cursor,
                       spec->padded) < 0 ||
            copy_param(PyTuple_GET_ITEM(pair, 1), "bias", i, 1, spec->out, 1,
                       cursor + spec->in * spec->padded, 1) < 0) {
            PyMem_Free(memory);
            goto done;
        }
        spec->weight = cursor;
        spec->bias = cursor + spec->in * spec->padded;
        cursor += (spec->in + 1) * spec->padded;
    }
    if (log_std_arg != Py_None) {
        float *log_std = cursor, *std = cursor + out_dim;
        Py_buffer view;
        if (PyObject_GetBuffer(log_std_arg, &view, PyBUF_RECORDS_RO) < 0) {
            PyMem_Free(memory);
            goto done;
        }
        int ok = has_format(&view, 'f') && view.itemsize == 4 && view.ndim == 1 &&
                 view.shape[0] == out_dim;
        if (ok) {
            for (Py_ssize_t j = 0; j < out_dim; j++) {
                memcpy(&log_std[j], (const char *)view.buf + j * view.strides[0], sizeof(float));
                std[j] = exp32(log_std[j]);
            }
        } else {
            PyErr_Format(PyExc_ValueError, "log_std must be a float32 array of shape (%zd,)", out_dim);
        }
        PyBuffer_Release(&view);
        if (!ok) {
            PyMem_Free(memory);
            goto done;
        }
        self->log_std = log_std;
        self->std = std;
    }
    self->memory = memory;
    self->layers = specs;
    self->n_layers = n;
    specs = NULL;
    result = 0;
    goto done;
too_large:
    PyErr_SetString(PyExc_MemoryError, "the network's layers are too large to hold");
done:
    PyMem_Free(specs);
    Py_DECREF(layers);
    return result;
}

static void Kernel_dealloc(Kernel *self) {
    PyMem_Free(self->memory);
    PyMem_Free(self->layers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_built(Kernel *self) {
    if (self->memory == NULL) {
        PyErr_SetString(PyExc_TypeError, "this Kernel was not built (call Kernel(layers, activation))");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ calls */

/* One call's operands: the observations and draws (views into caller buffers). */
typedef struct {
    const char *obs;
    Py_ssize_t obs_row, obs_col; /* byte strides */
    const char *draws;           /* NULL: deterministic */
    Py_ssize_t draw_row, draw_col;
    Py_ssize_t n;
} Batch;

/* Takes the observations (float32, (N, D), any strides) and the draws
 * (float64: (N, count), or (N,) when count is 1; None) of a call. */
static int open_batch(Kernel *self, PyObject *obs_arg, PyObject *draws_arg, Py_ssize_t count,
                      Py_buffer *obs_view, Py_buffer *draws_view, Batch *batch) {
    Py_ssize_t dim = self->layers[0].in;
    if (PyObject_GetBuffer(obs_arg, obs_view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "needs float32 observations, got %.100s",
                     Py_TYPE(obs_arg)->tp_name);
        return -1;
    }
    if (!has_format(obs_view, 'f') || obs_view->itemsize != 4 || obs_view->ndim != 2 ||
        obs_view->shape[1] != dim) {
        char got[160];
        describe(obs_view, got, sizeof got);
        PyErr_Format(obs_view->ndim == 2 && has_format(obs_view, 'f') ? PyExc_ValueError : PyExc_TypeError,
                     "needs float32 observations of shape (N, %zd), got %s", dim, got);
        PyBuffer_Release(obs_view);
        return -1;
    }
    batch->n = obs_view->shape[0];
    batch->obs = obs_view->buf;
    batch->obs_row = obs_view->strides[0];
    batch->obs_col = obs_view->strides[1];
    batch->draws = NULL;
    draws_view->obj = NULL;
    if (draws_arg == Py_None) return 0;
    if (PyObject_GetBuffer(draws_arg, draws_view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "needs float64 draws (an array) or None, got %.100s",
                     Py_TYPE(draws_arg)->tp_name);
        PyBuffer_Release(obs_view);
        return -1;
    }
    int shaped = draws_view->ndim == 2 ? draws_view->shape[0] == batch->n && draws_view->shape[1] == count
               : draws_view->ndim == 1 && count == 1 && draws_view->shape[0] == batch->n;
    if (!has_format(draws_view, 'd') || draws_view->itemsize != 8 || !shaped) {
        char got[160];
        describe(draws_view, got, sizeof got);
        PyObject *kind = has_format(draws_view, 'd') ? PyExc_ValueError : PyExc_TypeError;
        if (count == 1)
            PyErr_Format(kind, "needs float64 draws of shape (%zd, 1) or (%zd,), got %s", batch->n,
                         batch->n, got);
        else
            PyErr_Format(kind, "needs float64 draws of shape (%zd, %zd), got %s", batch->n, count, got);
        PyBuffer_Release(draws_view);
        PyBuffer_Release(obs_view);
        return -1;
    }
    batch->draws = draws_view->buf;
    batch->draw_row = draws_view->strides[0];
    batch->draw_col = draws_view->ndim == 2 ? draws_view->strides[1] : 0;
    return 0;
}

static void close_batch(Py_buffer *obs_view, Py_buffer *draws_view) {
    if (draws_view->obj != NULL) PyBuffer_Release(draws_view);
    PyBuffer_Release(obs_view);
}

/* A new numpy array (n,) or (n, cols) of `dtype`, and its data pointer. */
static PyObject *new_array(Py_ssize_t n, Py_ssize_t cols, PyObject *dtype, void **data) {
    PyObject *shape = cols < 0 ? PyLong_FromSsize_t(n) : Py_BuildValue("(nn)", n, cols);
    if (shape == NULL) return NULL;
    PyObject *call[2] = {shape, dtype};
    PyObject *array = PyObject_Vectorcall(numpy_empty, call, 2, NULL);
    Py_DECREF(shape);
    if (array == NULL) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    *data = view.buf; /* numpy keeps the memory for the array's lifetime */
    PyBuffer_Release(&view);
    return array;
}

/* The network's outputs for one row into `out` (padded); returns 0 if all finite. */
static int forward_row(const Kernel *self, const Batch *batch, Py_ssize_t i, float *scratch,
                       float **out) {
    const Layer *layers = self->layers;
    Py_ssize_t dim = layers[0].in, widest = (self->scratch - dim) / 3;
    const char *row = batch->obs + i * batch->obs_row;
    const float *in;
    if (batch->obs_col == sizeof(float) && (uintptr_t)row % sizeof(float) == 0) {
        in = (const float *)row;
    } else {
        for (Py_ssize_t k = 0; k < dim; k++) memcpy(&scratch[k], row + k * batch->obs_col, sizeof(float));
        in = scratch;
    }
    float *hidden[2] = {scratch + dim, scratch + dim + widest};
    float *result = scratch + dim + 2 * widest;
    for (Py_ssize_t l = 0; l < self->n_layers; l++) {
        float *dst = l == self->n_layers - 1 ? result : hidden[l & 1];
        int hidden_layer = l < self->n_layers - 1;
#ifdef WIDE_LANES
        if (wide_lanes) {
            dense8(in, &layers[l], dst);
            if (hidden_layer) activate8(self->activation, dst, layers[l].padded);
            in = dst;
            continue;
        }
#endif
        dense(in, &layers[l], dst);
        if (hidden_layer) activate(self->activation, dst, layers[l].padded);
        in = dst;
    }
    *out = result;
    const Py_ssize_t width = layers[self->n_layers - 1].out;
    for (Py_ssize_t j = 0; j < width; j++)
        if (!isfinite(result[j])) return -1;
    return 0;
}

/* Floats of stack scratch before a call allocates its own. */
#define STACK_FLOATS 2048
/* Multiply-adds in a batch above which a call releases the GIL. */
#define NOGIL_WORK 200000

static Py_ssize_t work_of(const Kernel *self, Py_ssize_t n) {
    Py_ssize_t per_row = 0;
    for (Py_ssize_t l = 0; l < self->n_layers; l++)
        per_row += self->layers[l].in * self->layers[l].padded;
    return per_row > 0 && n > NOGIL_WORK / per_row ? NOGIL_WORK + 1 : n * per_row;
}

typedef struct {
    int64_t *index;
    float *log_prob;
    float *values; /* logits or means */
    float *actions; /* Gaussian */
} Outputs;

/* Categorical rows; returns the first row whose logits are not finite, or -1. */
static Py_ssize_t categorical_rows(const Kernel *self, const Batch *batch, float *scratch,
                                   const Outputs *o) {
    const Py_ssize_t n_out = self->layers[self->n_layers - 1].out;
    float *weights = scratch; /* e: the first n_out floats; forward_row takes the rest */
    scratch += n_out;
    for (Py_ssize_t i = 0; i < batch->n; i++) {
        float *l;
        int bad = forward_row(self, batch, i, scratch, &l);
        memcpy(o->values + i * n_out, l, (size_t)n_out * sizeof(float));
        if (bad) return i;
        float m = l[0];
        for (Py_ssize_t j = 1; j < n_out; j++)
            if (l[j] > m) m = l[j];
        double total = 0.0;
        for (Py_ssize_t j = 0; j < n_out; j++) {
            weights[j] = exp32(l[j] - m);
            total = total + (double)weights[j];
        }
        Py_ssize_t k = -1;
        if (batch->draws == NULL) {
            for (k = 0; l[k] != m; k++) {
            }
        } else {
            double u;
            memcpy(&u, batch->draws + i * batch->draw_row, sizeof u);
            double t = u * total, c = 0.0;
            for (Py_ssize_t j = 0; j < n_out; j++) {
                c = c + (double)weights[j];
                if (c > t) {
                    k = j;
                    break;
                }
            }
            if (k < 0) /* t rounded up to Z: the last action of positive weight */
                for (k = n_out - 1; !(weights[k] > 0.0f); k--) {
                }
        }
        float s = l[k] - m;
        o->index[i] = k;
        o->log_prob[i] = (float)((double)s - log64(total));
    }
    return -1;
}

/* Gaussian rows; returns the first row whose means are not finite, or -1. */
static Py_ssize_t gaussian_rows(const Kernel *self, const Batch *batch, float *scratch,
                                const Outputs *o) {
    const Py_ssize_t d = self->layers[self->n_layers - 1].out;
    const float *log_std = self->log_std, *std = self->std;
    for (Py_ssize_t i = 0; i < batch->n; i++) {
        float *mean;
        int bad = forward_row(self, batch, i, scratch, &mean);
        memcpy(o->values + i * d, mean, (size_t)d * sizeof(float));
        if (bad) return i;
        float *action = o->actions + i * d;
        double total = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) {
            float z = 0.0f;
            if (batch->draws == NULL) {
                action[j] = mean[j];
            } else {
                double eps;
                memcpy(&eps, batch->draws + i * batch->draw_row + j * batch->draw_col, sizeof eps);
                z = (float)eps;
                float step = std[j] * z;
                action[j] = mean[j] + step;
            }
            double zz = (double)z;
            double term = -0.5 * zz;
            term = term * zz;
            term = term - (double)log_std[j];
            term = term - HALF_LOG_2PI;
            total = total + term;
        }
        o->log_prob[i] = (float)total;
    }
    return -1;
}

typedef Py_ssize_t (*RowsFn)(const Kernel *, const Batch *, float *, const Outputs *);

/* Runs `rows` over the batch with scratch of its own; -2 on allocation failure. */
static Py_ssize_t run_rows(Kernel *self, const Batch *batch, RowsFn rows, const Outputs *o) {
    /* forward_row's rows, and the categorical's weights e */
    Py_ssize_t needed = self->scratch + self->layers[self->n_layers - 1].padded;
    float stack[STACK_FLOATS];
    int nogil = work_of(self, batch->n) > NOGIL_WORK;
    float *scratch = stack;
    if (needed > STACK_FLOATS) {
        scratch = PyMem_RawMalloc((size_t)needed * sizeof(float));
        if (scratch == NULL) {
            PyErr_NoMemory();
            return -2;
        }
    }
    Py_ssize_t bad;
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        bad = rows(self, batch, scratch, o);
        Py_END_ALLOW_THREADS
    } else {
        bad = rows(self, batch, scratch, o);
    }
    if (scratch != stack) PyMem_RawFree(scratch);
    return bad;
}

/* The tuple (a, b, c, bad_row) a call returns; takes the references to a, b and c. */
static PyObject *pack(PyObject *a, PyObject *b, PyObject *c, Py_ssize_t bad_row) {
    PyObject *row = PyLong_FromSsize_t(bad_row);
    PyObject *tuple = row ? PyTuple_New(4) : NULL;
    if (tuple == NULL) {
        Py_XDECREF(row);
        Py_DECREF(a);
        Py_DECREF(b);
        Py_DECREF(c);
        return NULL;
    }
    PyTuple_SET_ITEM(tuple, 0, a);
    PyTuple_SET_ITEM(tuple, 1, b);
    PyTuple_SET_ITEM(tuple, 2, c);
    PyTuple_SET_ITEM(tuple, 3, row);
    return tuple;
}

PyDoc_STRVAR(categorical_doc,
"categorical(observations, draws)\n--\n\n"
"Samples each row's action from softmax(logits), as tests/mlp_reference.py does.\n\n"
"observations: float32 (N, D), any strides. draws: float64 (N,) or (N, 1), row i's\n"
"u in [0, 1); or None for the first argmax. Returns (index int64 (N,), log_prob\n"
"float32 (N,), logits float32 (N, n), bad_row): bad_row is -1, or the first row whose\n"
"logits are not finite (then only rows up to it hold values). Raises TypeError or\n"
"ValueError for operands of the wrong type or shape.");

/* One call of either distribution: operands, outputs, rows, the result tuple. */
static PyObject *sample(Kernel *self, PyObject *const *args, Py_ssize_t nargs, int gaussian) {
    const char *name = gaussian ? "gaussian" : "categorical";
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes (observations, draws), got %zd arguments", name, nargs);
        return NULL;
    }
    if (check_built(self) < 0) return NULL;
    if ((self->log_std != NULL) != gaussian) {
        PyErr_SetString(PyExc_TypeError, gaussian ? "this Kernel has no log_std: call categorical"
                                                  : "this Kernel was built with log_std: call gaussian");
        return NULL;
    }
    const Py_ssize_t width = self->layers[self->n_layers - 1].out;
    Py_buffer obs_view, draws_view;
    Batch batch;
    if (open_batch(self, args[0], args[1], gaussian ? width : 1, &obs_view, &draws_view, &batch) < 0)
        return NULL;
    const Py_ssize_t n = batch.n;
    Outputs o = {0};
    PyObject *first = gaussian ? new_array(n, width, dtype_f32, (void **)&o.actions)
                               : new_array(n, -1, dtype_i64, (void **)&o.index);
    PyObject *log_prob = first ? new_array(n, -1, dtype_f32, (void **)&o.log_prob) : NULL;
    PyObject *values = log_prob ? new_array(n, width, dtype_f32, (void **)&o.values) : NULL;
    PyObject *result = NULL;
    if (values != NULL) {
        Py_ssize_t bad = run_rows(self, &batch, gaussian ? gaussian_rows : categorical_rows, &o);
        if (bad != -2) {
            result = pack(first, log_prob, values, bad); /* takes them */
            first = log_prob = values = NULL;
        }
    }
    Py_XDECREF(first);
    Py_XDECREF(log_prob);
    Py_XDECREF(values);
    close_batch(&obs_view, &draws_view);
    return result;
}

static PyObject *Kernel_categorical(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    return sample(self, args, nargs, 0);
}

PyDoc_STRVAR(gaussian_doc,
"gaussian(observations, draws)\n--\n\n"
"Samples each row's action mean + exp(log_std) * eps, as tests/mlp_reference.py does.\n\n"
"observations: float32 (N, D), any strides. draws: float64 (N, d), row i's\n"
"standard normal eps; or None for the mean. Returns (actions float32 (N, d), log_prob\n"
"float32 (N,), mean float32 (N, d), bad_row): bad_row is -1, or the first row whose\n"
"means are not finite (then only rows up to it hold values). Raises TypeError or\n"
"ValueError for operands of the wrong type or shape.");

static PyObject *Kernel_gaussian(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    return sample(self, args, nargs, 1);
}

static PyMethodDef Kernel_methods[] = {
    {"categorical", (PyCFunction)(void (*)(void))Kernel_categorical, METH_FASTCALL, categorical_doc},
    {"gaussian", (PyCFunction)(void (*)(void))Kernel_gaussian, METH_FASTCALL, gaussian_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Kernel_doc,
"Kernel(layers, activation, log_std=None)\n--\n\n"
"One parameter set of a built-in MLP, copied into the kernel's own memory.\n\n"
"layers: (weight float32 (in, out), bias float32 (out,)) per dense layer, the last\n"
"giving the logits or means; activation: 'tanh', 'relu' or 'identity' (hidden layers);\n"
"log_std: float32 (d,) for a Gaussian kernel, None for a categorical one.");

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlfleet.policies._mlp_kernel.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Kernel_doc,
    .tp_methods = Kernel_methods,
    .tp_init = (initproc)Kernel_init,
    .tp_new = PyType_GenericNew,
};

/* ----------------------------------------------------------------- module */

/* Whether a product and a sum are rounded separately, in scalar and vector code
 * (a fused multiply-add would keep the product's low bits: 2**-24 here). */
static int products_round_alone(void) {
    volatile float a = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f);
    float x = a, y = c;
    float scalar = x * x + y;
    v4sf vx = splat(x), vy = splat(y);
    v4sf vector = vx * vx + vy;
    return scalar == 0.0f && vector[0] == 0.0f && vector[3] == 0.0f;
}

static int module_exec(PyObject *module) {
    if (!products_round_alone()) {
        PyErr_SetString(PyExc_ImportError,
                        "rlfleet.policies._mlp_kernel was compiled with floating-point contraction "
                        "(fused multiply-add), which breaks the policies' exact arithmetic; rebuild it "
                        "with -ffp-contract=off (as rlfleet's pyproject.toml does)");
        return -1;
    }
#ifdef WIDE_LANES
    __builtin_cpu_init();
    wide_lanes = __builtin_cpu_supports("avx2");
#endif
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL) return -1;
    numpy_empty = PyObject_GetAttrString(numpy, "empty");
    PyObject *dtype = numpy_empty ? PyObject_GetAttrString(numpy, "dtype") : NULL;
    dtype_f32 = dtype ? PyObject_CallFunction(dtype, "s", "float32") : NULL;
    dtype_i64 = dtype_f32 ? PyObject_CallFunction(dtype, "s", "int64") : NULL;
    Py_XDECREF(dtype);
    Py_DECREF(numpy);
    if (dtype_i64 == NULL) return -1;
    if (PyType_Ready(&KernelType) < 0) return -1;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(module, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(&KernelType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_mlp_kernel",
    .m_doc = "The built-in MLP policies' exact arithmetic (docs/policies.md, \"Exact arithmetic\").",
    .m_size = 0,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__mlp_kernel(void) { return PyModuleDef_Init(&module_def); }

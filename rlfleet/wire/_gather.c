/* Byte pieces of several buffers copied end to end into one, in one call (rlfleet.wire._gather).
 *
 * rlfleet.wire.placement builds each field of a learner's answer from the
 * results' arrays, which are views of the frames the learner received.
 * np.concatenate spends about 1,500 instructions on each result's view of
 * each field (and a scratch copy and np.take where results interleave); here
 * a field is one call over its pieces: (source, byte offset, byte count) rows
 * of an int64 array, copied one after the other into the answer's array.
 *
 * The sources are network frames and the pieces worked out from their counts:
 * every piece is checked against its source's bytes and the destination's
 * before anything is copied (sizes compared without adding to offsets, so no
 * overflow), and a piece that does not fit is refused with InvalidValueError
 * (rlfleet.errors), the destination untouched, as is a source that shares
 * memory with the destination. Every buffer is held only for the call and
 * released on every path; no Python code runs while they are held (a large
 * copy lets other threads run meanwhile).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* rlfleet.errors.InvalidValueError, looked up when the module is loaded. */
static PyObject *invalid_value_error = NULL;

/* Pieces of up to this many bytes are copied in a loop, not by memcpy. */
#define SMALL_PIECE 16

/* A copy of this many bytes or more lets other threads run (the learner's
 * receiving ones), as numpy's copies do: the buffers stay held. */
#define UNLOCKED_BYTES (64 * 1024)

/* Buffers held on the stack for this many sources (a per-env answer's
 * hundred results take the heap). */
#define STACK_SOURCES 32

/* Whether an int64 buffer's format is one (native byte order: the pieces are
 * made in this process). */
static int is_int64(const Py_buffer *view) {
    const char *f = view->format;
    if (view->itemsize != 8 || f == NULL) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

/* A format past its byte order where that is this machine's ('@', '=', and
 * '<' on a little-endian one): numpy writes "=f" for a view of a frame and
 * "f" for its own array of the same dtype. */
static const char *past_native_order(const char *format) {
    const uint16_t one = 1;
    int little = *(const unsigned char *)&one == 1;
    if (format[0] == '@' || format[0] == '=' || (little && format[0] == '<')) return format + 1;
    return format;
}

/* A one-letter format's kind: signed and unsigned integers each one kind
 * whatever their letter ('q' and 'l' are both int64 here; the item sizes
 * are compared apart), any other letter its own. */
static char kind_of(char letter) {
    if (strchr("bhilqn", letter) != NULL) return 's';
    if (strchr("BHILQN", letter) != NULL) return 'u';
    return letter;
}

/* Whether two buffers' formats hold the same values (a dtype's: the caller
 * need not compare each source's dtype in Python, about 600 instructions a
 * source): the same kind of one letter, or the same text past the byte order. */
static int same_format(const Py_buffer *a, const Py_buffer *b) {
    const char *x = past_native_order(a->format ? a->format : "B");
    const char *y = past_native_order(b->format ? b->format : "B");
    if (x[0] != '\0' && x[1] == '\0' && y[0] != '\0' && y[1] == '\0')
        return kind_of(x[0]) == kind_of(y[0]);
    return strcmp(x, y) == 0;
}

/* Whether a source's rows are the destination's: as many dimensions, the same
 * shape past the first, the same item size and format. */
static int same_rows(const Py_buffer *source, const Py_buffer *dest) {
    if (source->ndim != dest->ndim || source->itemsize != dest->itemsize || dest->ndim < 1)
        return 0;
    if (!same_format(source, dest)) return 0;
    for (int d = 1; d < dest->ndim; d++) {
        if (source->shape[d] != dest->shape[d]) return 0;
    }
    return 1;
}

/* Whether two buffers share a byte (the copy below is memcpy's). */
static int overlap(const Py_buffer *a, const Py_buffer *b) {
    uintptr_t a0 = (uintptr_t)a->buf, b0 = (uintptr_t)b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + (uintptr_t)b->len &&
           b0 < a0 + (uintptr_t)a->len;
}

/* Every source whole, one after the other (checked to fit). */
static void copy_whole(char *at, const Py_buffer *sources, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) {
        memcpy(at, sources[k].buf, (size_t)sources[k].len);
        at += sources[k].len;
    }
}

/* The n pieces, one after the other (checked to fit). */
static void copy_pieces(char *at, const Py_buffer *sources, const int64_t *piece, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t size = piece[3 * k + 2];
        const char *from = (const char *)sources[piece[3 * k]].buf + piece[3 * k + 1];
        if (size <= SMALL_PIECE) {
            /* A row or two of a small field (an episode's info, where
             * results interleave episode by episode): bytes in a loop, where
             * a call costs more than the copy. */
            for (int64_t i = 0; i < size; i++) at[i] = from[i];
        } else {
            memcpy(at, from, (size_t)size);
        }
        at += size;
    }
}

PyDoc_STRVAR(gather_doc,
"gather(dest, sources, pieces, rows=False, /)\n--\n\n"
"Copies pieces of ``sources`` one after the other into ``dest``.\n\n"
"dest: a writable C-contiguous buffer, filled exactly.\n"
"sources: a list or tuple of buffers.\n"
"pieces: a C-contiguous int64 buffer of (source index, byte offset, byte count)\n"
"rows, 3 values a piece; None for every source whole, in order.\n"
"rows: whether every source must hold rows of dest's: C-contiguous, as many\n"
"dimensions, the same shape past the first, the same item size and format (any\n"
"contiguous source, as bytes, otherwise).\n\n"
"Returns True once copied; False, nothing copied, if a source is not a\n"
"contiguous buffer (or, with rows, not of dest's rows): the caller copies\n"
"another way.\n"
"Raises InvalidValueError (rlfleet.errors), nothing copied, if a source shares\n"
"memory with dest, a piece names no source, lies outside its source or the\n"
"pieces do not fill dest exactly.");

static PyObject *gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs < 3 || nargs > 4) {
        PyErr_Format(PyExc_TypeError, "gather takes 3 or 4 arguments (%zd given)", nargs);
        return NULL;
    }
    int rows = 0;
    if (nargs == 4 && (rows = PyObject_IsTrue(args[3])) < 0) return NULL;
    PyObject *listed = PySequence_Fast(args[1], "gather's sources must be a list or tuple");
    if (listed == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(listed);
    PyObject **items = PySequence_Fast_ITEMS(listed);

    Py_buffer dest, pieces;
    Py_buffer stack[STACK_SOURCES];
    Py_buffer *sources = stack;
    Py_ssize_t held = 0; /* sources whose buffers are held */
    int have_dest = 0, have_pieces = 0;
    int whole = args[2] == Py_None; /* every source whole, in order */
    PyObject *out = NULL;

    if (PyObject_GetBuffer(args[0], &dest, PyBUF_WRITABLE | PyBUF_ND | (rows ? PyBUF_FORMAT : 0)) <
        0)
        goto done;
    have_dest = 1;
    if (!whole) {
        if (PyObject_GetBuffer(args[2], &pieces, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) goto done;
        have_pieces = 1;
    }
    if (!whole && (!is_int64(&pieces) || pieces.len % 24 != 0)) {
        PyErr_Format(invalid_value_error,
                     "gather's pieces must be int64 (source, byte offset, byte count) rows; got "
                     "%zd bytes of format '%s': make them with np.asarray(..., np.int64)",
                     pieces.len, pieces.format ? pieces.format : "B");
        goto done;
    }
    if (count > STACK_SOURCES) {
        sources = PyMem_Malloc((size_t)count * sizeof(Py_buffer));
        if (sources == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (; held < count; held++) {
        int flags = rows ? PyBUF_ND | PyBUF_FORMAT : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(items[held], &sources[held], flags) < 0) {
            /* Not a contiguous buffer (numpy says so with ValueError): another way. */
            if (!PyErr_ExceptionMatches(PyExc_BufferError) &&
                !PyErr_ExceptionMatches(PyExc_ValueError) &&
                !PyErr_ExceptionMatches(PyExc_TypeError))
                goto done;
            PyErr_Clear();
            out = Py_NewRef(Py_False);
            goto done;
        }
        if (rows && !same_rows(&sources[held], &dest)) {
            held++;
            out = Py_NewRef(Py_False);
            goto done;
        }
        if (overlap(&sources[held], &dest)) {
            PyErr_Format(invalid_value_error,
                         "gather's source %zd shares memory with dest: copy it first", held);
            held++;
            goto done;
        }
    }

    Py_ssize_t room = dest.len; /* bytes of dest not yet claimed */
    if (whole) {
        for (Py_ssize_t k = 0; k < count; k++) {
            if (sources[k].len > room) {
                PyErr_Format(invalid_value_error,
                             "gather's sources up to %zd hold more than dest's %zd bytes: they "
                             "must fill it exactly",
                             k, dest.len);
                goto done;
            }
            room -= sources[k].len;
        }
        if (room != 0) {
            PyErr_Format(invalid_value_error,
                         "gather's sources hold %zd bytes, dest %zd: they must fill it exactly",
                         dest.len - room, dest.len);
            goto done;
        }
        if (dest.len >= UNLOCKED_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            copy_whole(dest.buf, sources, count);
            Py_END_ALLOW_THREADS
        } else {
            copy_whole(dest.buf, sources, count);
        }
        out = Py_NewRef(Py_True);
        goto done;
    }
    const int64_t *piece = pieces.buf;
    Py_ssize_t n = pieces.len / 24;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t index = piece[3 * k], offset = piece[3 * k + 1], size = piece[3 * k + 2];
        if (index < 0 || index >= count) {
            PyErr_Format(invalid_value_error,
                         "gather's piece %zd names source %lld of %zd: pieces index the sources",
                         k, (long long)index, count);
            goto done;
        }
        Py_ssize_t length = sources[index].len;
        if (offset < 0 || size < 0 || offset > length || size > length - offset) {
            PyErr_Format(invalid_value_error,
                         "gather's piece %zd (bytes %lld + %lld of source %lld) lies outside its "
                         "%zd bytes: a piece must be inside its source",
                         k, (long long)offset, (long long)size, (long long)index, length);
            goto done;
        }
        if (size > room) {
            PyErr_Format(invalid_value_error,
                         "gather's pieces up to %zd hold more than dest's %zd bytes: they must "
                         "fill it exactly",
                         k, dest.len);
            goto done;
        }
        room -= (Py_ssize_t)size;
    }
    if (room != 0) {
        PyErr_Format(invalid_value_error,
                     "gather's pieces hold %zd bytes, dest %zd: they must fill it exactly",
                     dest.len - room, dest.len);
        goto done;
    }
    if (dest.len >= UNLOCKED_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy_pieces(dest.buf, sources, piece, n);
        Py_END_ALLOW_THREADS
    } else {
        copy_pieces(dest.buf, sources, piece, n);
    }
    out = Py_NewRef(Py_True);

done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&sources[i]);
    if (sources != stack) PyMem_Free(sources);
    if (have_pieces) PyBuffer_Release(&pieces);
    if (have_dest) PyBuffer_Release(&dest);
    Py_DECREF(listed);
    return out;
}

static PyMethodDef module_methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL, gather_doc},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    (void)module;
    if (invalid_value_error != NULL) return 0;
    PyObject *errors = PyImport_ImportModule("rlfleet.errors");
    if (errors == NULL) return -1;
    invalid_value_error = PyObject_GetAttrString(errors, "InvalidValueError");
    Py_DECREF(errors);
    return invalid_value_error == NULL ? -1 : 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_gather",
    .m_doc = "Byte pieces of several buffers copied end to end into one, in one call "
             "(rlfleet.wire.placement).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__gather(void) { return PyModuleDef_Init(&module_def); }

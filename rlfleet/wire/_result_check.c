/* The byte-level work of a worker's result checked in one pass, in one call
 * (rlfleet.wire._result_check).
 *
 * rlfleet.wire.result_layout checks each episodes result of a worker whose
 * layout it knows with episodes_pass: the bytes around the arrays, the int64
 * columns the header's numbers and the task's units tell (lengths, episode
 * index, worker, agent version, env and policy seeds), the indices'
 * ascending order and the step types' rules, against a result's bytes joined
 * or left in its chunks. It answers True or False; False sends the result
 * down the general path, which raises with its own text (or finds nothing
 * wrong): this call never lets through what the general path refuses
 * (tests/test_result_layout.py holds it to the general path's answers).
 * values_pass screens the result's values (ints and floats against their
 * bounds, rewards' finite sum, bools) where they lie, with the verdicts of
 * the numpy screens it replaces (tests/test_value_screens.py).
 *
 * Every byte is network input, and so are the header's numbers: each read is
 * bounds-checked against the result's size with no addition that can
 * overflow, a header number that is not an int64 is refused (False), and the
 * buffers are held only for the call (released on every path), with no
 * Python code run while they are held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* StepType (rlfleet/core/step_type.py): part of the wire contract. */
enum { FIRST = 0, MID = 1, TERMINAL = 2, TIMEOUT = 3 };

/* The int64 columns episodes_pass compares, in the order of their offsets in
 * ``places`` (after the runs), then the step types'. */
enum { LENGTHS, INDICES, WORKERS, VERSIONS, ENV_SEEDS, POLICY_SEEDS, COLUMNS };
#define PLACES_AFTER_RUNS (COLUMNS + 1)

/* A result's bytes: one buffer, or its chunks' one after the other. */
typedef struct {
    Py_buffer *views;
    Py_ssize_t count, size;
} Source;

static void source_release(Source *s) {
    for (Py_ssize_t i = 0; i < s->count; i++) PyBuffer_Release(&s->views[i]);
    PyMem_Free(s->views);
    s->views = NULL;
    s->count = 0;
}

/* ``data`` (a buffer, or a tuple of them) into *s: 0, or -1 with an error set. */
static int source_open(PyObject *data, Source *s) {
    int pieces = PyTuple_Check(data);
    Py_ssize_t n = pieces ? PyTuple_GET_SIZE(data) : 1;
    s->views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    s->count = 0;
    s->size = 0;
    if (s->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = pieces ? PyTuple_GET_ITEM(data, i) : data;
        if (PyObject_GetBuffer(item, &s->views[i], PyBUF_SIMPLE) < 0) {
            source_release(s);
            return -1;
        }
        s->count = i + 1;
        s->size += s->views[i].len; /* each is in memory: their sum fits */
    }
    return 0;
}

/* Whether [offset, offset + n) lies in the result (no addition that overflows). */
static inline int source_holds(const Source *s, Py_ssize_t offset, Py_ssize_t n) {
    return offset >= 0 && n >= 0 && offset <= s->size && n <= s->size - offset;
}

/* Calls visit(part, size, arg) on the parts of [offset, offset + n) in each
 * chunk, in order, until one returns nonzero (returned); 0 after the last.
 * The span must lie in the result (source_holds). */
static int source_walk(const Source *s, Py_ssize_t offset, Py_ssize_t n,
                       int (*visit)(const uint8_t *, Py_ssize_t, void *), void *arg) {
    for (Py_ssize_t i = 0; i < s->count && n > 0; i++) {
        Py_ssize_t len = s->views[i].len;
        if (offset >= len) {
            offset -= len;
            continue;
        }
        Py_ssize_t part = len - offset < n ? len - offset : n;
        int stop = visit((const uint8_t *)s->views[i].buf + offset, part, arg);
        if (stop) return stop;
        n -= part;
        offset = 0;
    }
    return 0;
}

static int compare_part(const uint8_t *part, Py_ssize_t size, void *arg) {
    const uint8_t **expected = arg;
    if (memcmp(part, *expected, (size_t)size) != 0) return 1;
    *expected += size;
    return 0;
}

/* Whether the result holds ``expected``'s n bytes at offset. */
static int source_equal(const Source *s, Py_ssize_t offset, const uint8_t *expected,
                        Py_ssize_t n) {
    return source_holds(s, offset, n) && source_walk(s, offset, n, compare_part, &expected) == 0;
}

static int copy_part(const uint8_t *part, Py_ssize_t size, void *arg) {
    uint8_t **to = arg;
    memcpy(*to, part, (size_t)size);
    *to += size;
    return 0;
}

/* The n bytes at offset, in one piece: a pointer into the chunk that holds
 * them all, else a copy into *scratch (PyMem_Malloc'd, the caller frees it).
 * NULL if they are not in the result, or with MemoryError set. */
static const uint8_t *source_span(const Source *s, Py_ssize_t offset, Py_ssize_t n,
                                  uint8_t **scratch) {
    *scratch = NULL;
    if (!source_holds(s, offset, n)) return NULL;
    Py_ssize_t at = offset;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        Py_ssize_t len = s->views[i].len;
        if (at < len || (n == 0 && at == len)) {
            if (n <= len - at) return (const uint8_t *)s->views[i].buf + at;
            break;
        }
        at -= len;
    }
    *scratch = PyMem_Malloc(n > 0 ? (size_t)n : 1);
    if (*scratch == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    uint8_t *to = *scratch;
    (void)source_walk(s, offset, n, copy_part, &to);
    return *scratch;
}

static inline int64_t int64_at(const uint8_t *p, Py_ssize_t i) {
    uint64_t v = 0;
#if PY_LITTLE_ENDIAN
    memcpy(&v, p + 8 * i, sizeof v); /* one load, any alignment (a byte loop per column
                                        value cost 32 instructions) */
#else
    for (int b = 7; b >= 0; b--) v = (v << 8) | p[8 * i + b]; /* little-endian, any alignment */
#endif
    return (int64_t)v;
}

/* ``value`` as an int64 into *out: 1, or 0 for anything else (an error cleared). */
static int int64_of(PyObject *value, int64_t *out) {
    if (!PyLong_CheckExact(value)) return 0; /* no __index__: no Python code runs */
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* The ints of ``items`` (a tuple) into out[0:n]: 1, or 0 if one is not an int64. */
static int int64s_of(PyObject *items, int64_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!int64_of(PyTuple_GET_ITEM(items, i), &out[i])) return 0;
    return 1;
}

/* The step types' rules (step_type_problems of whole episodes finding none):
 * each episode's last step TERMINAL or TIMEOUT, its first FIRST if it has two
 * or more, every other MID. The lengths are >= 1 and sum to steps. */
static int step_types_pass(const uint8_t *types, const int64_t *lengths, Py_ssize_t episodes) {
    const uint8_t *p = types;
    Py_ssize_t ends = 0; /* the episodes' first and last steps: none of them MID */
    for (Py_ssize_t e = 0; e < episodes; e++) {
        int64_t length = lengths[e];
        const uint8_t *last = p + length - 1;
        if (*last != TERMINAL && *last != TIMEOUT) return 0;
        if (length >= 2 && *p != FIRST) return 0;
        ends += length >= 2 ? 2 : 1;
        p = last + 1;
    }
    /* Every other step MID: the steps not MID are exactly the ends, counted in
     * one loop over the whole column (vectorised), not one per episode. */
    Py_ssize_t steps = p - types, not_mid = 0;
    for (Py_ssize_t i = 0; i < steps; i++) not_mid += types[i] != MID;
    return not_mid == ends;
}

/* The position of ``index`` in held[0:n] (ascending), or -1 if not held. */
static Py_ssize_t held_at(const int64_t *held, Py_ssize_t n, int64_t index) {
    Py_ssize_t low = 0, high = n;
    while (low < high) {
        Py_ssize_t mid = low + (high - low) / 2;
        if (held[mid] < index)
            low = mid + 1;
        else
            high = mid;
    }
    return low < n && held[low] == index ? low : -1;
}

/* Whether the seeds columns hold the units' seeds of ``indices``: ``units`` a
 * tuple of three int64 buffers (episode indices ascending, env seeds, policy
 * seeds): 1 or 0 (0 too for columns not contiguous: the general path compares
 * them), -1 with an error set if they are not three int64 columns. */
static int unit_seeds_pass(PyObject *units, const int64_t *indices, Py_ssize_t episodes,
                           const uint8_t *env, const uint8_t *policy) {
    if (!PyTuple_Check(units) || PyTuple_GET_SIZE(units) != 3) {
        PyErr_SetString(PyExc_TypeError, "units must be a tuple of three int64 buffers");
        return -1;
    }
    Py_buffer columns[3];
    int opened = 0, verdict = -1;
    for (; opened < 3; opened++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(units, opened), &columns[opened],
                               PyBUF_C_CONTIGUOUS) < 0) {
            /* Columns not in one piece: the general path compares them. */
            PyErr_Clear();
            verdict = 0;
            goto done;
        }
    }
    Py_ssize_t held_count = columns[0].len / 8;
    if (columns[0].len % 8 || columns[1].len != columns[0].len ||
        columns[2].len != columns[0].len) {
        PyErr_SetString(PyExc_ValueError, "units must be three int64 columns of one length");
        goto done;
    }
    const int64_t *held = columns[0].buf, *env_seeds = columns[1].buf,
                  *policy_seeds = columns[2].buf;
    verdict = 0;
    Py_ssize_t start = held_at(held, held_count, indices[0]);
    /* A run of the task's units, as a task's results are; else each looked up. */
    int run = start >= 0 && episodes <= held_count - start;
    for (Py_ssize_t i = 0; run && i < episodes; i++) run = held[start + i] == indices[i];
    for (Py_ssize_t i = 0; i < episodes; i++) {
        Py_ssize_t at = run ? start + i : held_at(held, held_count, indices[i]);
        if (at < 0 || int64_at(env, i) != env_seeds[at] || int64_at(policy, i) != policy_seeds[at])
            goto done;
    }
    verdict = 1;
done:
    for (int i = 0; i < opened; i++) PyBuffer_Release(&columns[i]);
    return verdict;
}

PyDoc_STRVAR(episodes_pass_doc,
"episodes_pass(data, between, places, lengths, indices, worker_id, agent_version, seeds, /)\n"
"--\n\n"
"Whether an episodes result's bytes hold what its layout and header tell.\n\n"
"data: the result's bytes, a buffer or a tuple of its chunks' buffers.\n"
"between: the bytes around the arrays, the runs joined.\n"
"places: native int64s: each run's (offset, size), then the offsets of the\n"
"lengths, episode index, worker, agent version, env seed and policy seed\n"
"columns and of the uint8 step types.\n"
"lengths, indices: the header's (tuples of int; ascending indices).\n"
"seeds: None (not compared), (env_seed, policy_seed) every episode holds,\n"
"or the task's units (episode indices ascending, env seeds, policy seeds:\n"
"a tuple of three int64 buffers).\n"
"False for any difference, and for a number that is not an int64.");

static PyObject *episodes_pass(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "episodes_pass takes 8 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *data = args[0], *between = args[1], *places = args[2], *lengths = args[3],
             *indices = args[4], *seeds = args[7];
    if (!PyBytes_Check(between) || !PyBytes_Check(places) || !PyTuple_Check(lengths) ||
        !PyTuple_Check(indices)) {
        PyErr_SetString(PyExc_TypeError, "between and places must be bytes, lengths and "
                                         "indices tuples");
        return NULL;
    }
    Py_ssize_t place_count = PyBytes_GET_SIZE(places) / 8;
    if (PyBytes_GET_SIZE(places) % 8 || place_count < PLACES_AFTER_RUNS ||
        (place_count - PLACES_AFTER_RUNS) % 2) {
        PyErr_SetString(PyExc_ValueError, "places must be int64 (offset, size) pairs, then 7 "
                                          "offsets");
        return NULL;
    }
    Py_ssize_t episodes = PyTuple_GET_SIZE(lengths);
    int64_t worker, version, fixed[2] = {0, 0};
    if (episodes < 1 || PyTuple_GET_SIZE(indices) != episodes || !int64_of(args[5], &worker) ||
        !int64_of(args[6], &version))
        Py_RETURN_FALSE;
    int fixed_seeds = PyTuple_Check(seeds) && PyTuple_GET_SIZE(seeds) == 2;
    if (fixed_seeds && (!int64_of(PyTuple_GET_ITEM(seeds, 0), &fixed[0]) ||
                        !int64_of(PyTuple_GET_ITEM(seeds, 1), &fixed[1])))
        Py_RETURN_FALSE;
    if (episodes > PY_SSIZE_T_MAX / 16) Py_RETURN_FALSE; /* two columns' worth fits */
    int64_t *numbers = PyMem_Malloc(2 * (size_t)episodes * sizeof(int64_t));
    if (numbers == NULL) return PyErr_NoMemory();
    int64_t *lengths_of = numbers, *indices_of = numbers + episodes;
    int verdict = 0;
    Source source = {NULL, 0, 0};
    uint8_t *scratch[COLUMNS + 1] = {NULL};
    if (!int64s_of(lengths, lengths_of, episodes) || !int64s_of(indices, indices_of, episodes))
        goto done;
    int64_t steps = 0;
    for (Py_ssize_t i = 0; i < episodes; i++) {
        if (lengths_of[i] < 1 || lengths_of[i] > PY_SSIZE_T_MAX - steps) goto done;
        steps += lengths_of[i];
        if (i ? indices_of[i] <= indices_of[i - 1] : indices_of[0] < 0) goto done; /* ascending */
    }
    if (source_open(data, &source) < 0) {
        verdict = -1;
        goto done;
    }
    /* The bytes around the arrays. */
    const char *placed = PyBytes_AS_STRING(places);
    int64_t place[2];
    const uint8_t *expected = (const uint8_t *)PyBytes_AS_STRING(between);
    Py_ssize_t expected_left = PyBytes_GET_SIZE(between);
    Py_ssize_t runs = (place_count - PLACES_AFTER_RUNS) / 2;
    for (Py_ssize_t r = 0; r < runs; r++) {
        memcpy(place, placed + 16 * r, sizeof place);
        if (place[0] < 0 || place[0] > PY_SSIZE_T_MAX || place[1] < 0 ||
            place[1] > expected_left ||
            !source_equal(&source, (Py_ssize_t)place[0], expected, (Py_ssize_t)place[1]))
            goto done;
        expected += place[1];
        expected_left -= (Py_ssize_t)place[1];
    }
    /* The int64 columns, then the step types. */
    const uint8_t *column[COLUMNS + 1];
    for (int c = 0; c <= COLUMNS; c++) {
        int64_t offset;
        memcpy(&offset, placed + 16 * runs + 8 * c, sizeof offset);
        Py_ssize_t size = c == COLUMNS ? (Py_ssize_t)steps : 8 * episodes;
        if (offset < 0 || offset > PY_SSIZE_T_MAX) goto done;
        column[c] = source_span(&source, (Py_ssize_t)offset, size, &scratch[c]);
        if (column[c] == NULL) {
            verdict = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < episodes; i++) {
        if (int64_at(column[LENGTHS], i) != lengths_of[i] ||
            int64_at(column[INDICES], i) != indices_of[i] ||
            int64_at(column[WORKERS], i) != worker || int64_at(column[VERSIONS], i) != version)
            goto done;
        if (fixed_seeds && (int64_at(column[ENV_SEEDS], i) != fixed[0] ||
                            int64_at(column[POLICY_SEEDS], i) != fixed[1]))
            goto done;
    }
    if (!step_types_pass(column[COLUMNS], lengths_of, episodes)) goto done;
    if (fixed_seeds || seeds == Py_None)
        verdict = 1;
    else
        verdict = unit_seeds_pass(seeds, indices_of, episodes, column[ENV_SEEDS],
                                  column[POLICY_SEEDS]);
done:
    for (int c = 0; c <= COLUMNS; c++) PyMem_Free(scratch[c]);
    source_release(&source);
    PyMem_Free(numbers);
    if (verdict < 0) return NULL;
    return PyBool_FromLong(verdict);
}

/* ---- The value screens (values_pass) ---------------------------------------
 *
 * A screen's spec (bytes, made once per layout by rlfleet.wire._layout_frames):
 * a ScreenHead, then for 'w' the low bounds (``bounds`` values of type
 * ``compare``), then the high ones. An array's elements are read where they
 * lie (memcpy: any alignment), in native order (the layout's dtypes are
 * native), and compared as numpy compares them: in the array's type, or a
 * float32 array converted to double against float64 bounds (numpy's
 * promotion). A bound the screen does not check is one no value breaks
 * (-inf, +inf, an integer type's limits); NaN is outside no bound (both
 * comparisons false), as in numpy. */
enum { PER_EPISODE = 4 };

typedef struct {
    char op;      /* 'w': within bounds, 'f': a finite sum, 'o': bools (bytes 0 or 1) */
    char type;    /* the array's struct code: bhiqBHIQfd ('?' for bools) */
    char compare; /* the bounds' struct code: ``type``, or 'd' for 'f' */
    uint8_t flags;
    uint8_t pad[4];
    int64_t row;    /* elements per row */
    int64_t bounds; /* bound values each: 1 (one for every element) or ``row`` */
} ScreenHead;

/* Elements compared between two looks at the verdict: bounds are repeated
 * to a block of about this many, so short rows (CartPole's 4) run one long
 * loop the compiler vectorises. */
#define BLOCK 256

/* Bounds repeated to a block: ``low`` (and ``high``, or the width high - low)
 * k values each, PyMem_Malloc'd for 2 * *block values of ``size`` bytes. */
static uint8_t *tiled(const uint8_t *low, const uint8_t *high, Py_ssize_t k, size_t size,
                      Py_ssize_t *block) {
    *block = k < BLOCK ? BLOCK / k * k : k;
    uint8_t *out = PyMem_Malloc(2 * (size_t)*block * size);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    uint8_t *highs = out + (size_t)*block * size;
    memcpy(out, low, (size_t)k * size);
    memcpy(highs, high, (size_t)k * size);
    for (Py_ssize_t filled = k; filled < *block; filled *= 2) { /* doubling: few copies */
        Py_ssize_t more = filled < *block - filled ? filled : *block - filled;
        memcpy(out + (size_t)filled * size, out, (size_t)more * size);
        memcpy(highs + (size_t)filled * size, highs, (size_t)more * size);
    }
    return out;
}

/* Whether every one of n floats (at p) lies within its bounds: low[i % k]
 * and high[i % k] (``low`` and ``high`` hold k values each, k dividing n);
 * T the array's type, C the bounds'. -1 with MemoryError set. */
#define WITHIN_FLOAT(NAME, T, C)                                                           \
    static int NAME(const uint8_t *p, Py_ssize_t n, Py_ssize_t k, const uint8_t *low_at,   \
                    const uint8_t *high_at) {                                              \
        if (k == 1) { /* one bound each: held in registers, no block */                     \
            C l, h;                                                                        \
            memcpy(&l, low_at, sizeof(C));                                                 \
            memcpy(&h, high_at, sizeof(C));                                                \
            int out = 0;                                                                   \
            for (Py_ssize_t i = 0; i < n; i++) {                                           \
                T v;                                                                       \
                memcpy(&v, p + i * (Py_ssize_t)sizeof(T), sizeof(T));                      \
                out |= ((C)v < l) | ((C)v > h);                                            \
            }                                                                              \
            return !out;                                                                   \
        }                                                                                  \
        Py_ssize_t block;                                                                  \
        C *low = (C *)tiled(low_at, high_at, k, sizeof(C), &block);                        \
        if (low == NULL) return -1;                                                        \
        const C *high = low + block;                                                       \
        int out = 0;                                                                       \
        for (Py_ssize_t at = 0; at < n && !out; at += block) {                             \
            Py_ssize_t m = n - at < block ? n - at : block;                                \
            const uint8_t *q = p + at * (Py_ssize_t)sizeof(T);                             \
            for (Py_ssize_t j = 0; j < m; j++) {                                           \
                T v;                                                                       \
                memcpy(&v, q + j * (Py_ssize_t)sizeof(T), sizeof(T));                      \
                out |= ((C)v < low[j]) | ((C)v > high[j]);                                 \
            }                                                                              \
        }                                                                                  \
        PyMem_Free(low);                                                                   \
        return !out;                                                                       \
    }

/* Whether n integers of U's width (at p) lie within low[i % block] +
 * [0, width[i % block]] (``block`` values each): the unsigned v - low is at
 * most the width (two's complement: unsigned arithmetic wraps), found as
 * the borrow out of width - (v - low) with no comparison, which the compiler
 * vectorises for 64-bit values too (x86-64's baseline has no 64-bit vector
 * compare). */
#define OUTSIDE(NAME, U)                                                                   \
    static int NAME(const uint8_t *p, Py_ssize_t n, const U *low, const U *width,          \
                    Py_ssize_t block) {                                                    \
        U out = 0;                                                                         \
        for (Py_ssize_t at = 0; at < n && !(out >> (8 * sizeof(U) - 1)); at += block) {    \
            Py_ssize_t m = n - at < block ? n - at : block;                                \
            const uint8_t *q = p + at * (Py_ssize_t)sizeof(U);                             \
            for (Py_ssize_t j = 0; j < m; j++) {                                           \
                U v;                                                                       \
                memcpy(&v, q + j * (Py_ssize_t)sizeof(U), sizeof(U));                      \
                U d = (U)(v - low[j]), w = width[j];                                       \
                out |= (U)((~w & d) | (~(w ^ d) & (U)(w - d))); /* top bit: d > w */       \
            }                                                                              \
        }                                                                                  \
        return (int)(out >> (8 * sizeof(U) - 1));                                          \
    }

/* OUTSIDE's loop against one low bound and width for every element. */
#define OUTSIDE_ONE(NAME, U)                                                               \
    static int NAME(const uint8_t *p, Py_ssize_t n, U low, U width) {                      \
        U out = 0;                                                                         \
        for (Py_ssize_t i = 0; i < n; i++) {                                               \
            U v;                                                                           \
            memcpy(&v, p + i * (Py_ssize_t)sizeof(U), sizeof(U));                          \
            U d = (U)(v - low);                                                            \
            out |= (U)((~width & d) | (~(width ^ d) & (U)(width - d)));                    \
        }                                                                                  \
        return (int)(out >> (8 * sizeof(U) - 1));                                          \
    }

OUTSIDE_ONE(outside_8_one, uint8_t)
OUTSIDE_ONE(outside_16_one, uint16_t)
OUTSIDE_ONE(outside_32_one, uint32_t)
OUTSIDE_ONE(outside_64_one, uint64_t)
OUTSIDE(outside_8, uint8_t)
OUTSIDE(outside_16, uint16_t)
OUTSIDE(outside_32, uint32_t)
OUTSIDE(outside_64, uint64_t)

/* The integers' screen, as WITHIN_FLOAT's (T signed or unsigned, U its
 * unsigned type, OUTSIDE_U the loop of U's width). */
#define WITHIN_INT(NAME, T, U, OUTSIDE_U)                                                   \
    static int NAME(const uint8_t *p, Py_ssize_t n, Py_ssize_t k, const uint8_t *low_at,    \
                    const uint8_t *high_at) {                                               \
        for (Py_ssize_t j = 0; j < k; j++) {                                                \
            T l, h;                                                                         \
            memcpy(&l, low_at + j * (Py_ssize_t)sizeof(T), sizeof(T));                      \
            memcpy(&h, high_at + j * (Py_ssize_t)sizeof(T), sizeof(T));                     \
            if (h < l) return n == 0; /* no value lies in such bounds */                    \
        }                                                                                   \
        if (k == 1) { /* one bound each: held in registers, no block */                      \
            U l, w;                                                                         \
            memcpy(&l, low_at, sizeof(U));                                                  \
            memcpy(&w, high_at, sizeof(U));                                                 \
            w -= l;                                                                         \
            return !OUTSIDE_U##_one(p, n, l, w);                                            \
        }                                                                                   \
        Py_ssize_t block;                                                                   \
        U *low = (U *)tiled(low_at, high_at, k, sizeof(U), &block);                         \
        if (low == NULL) return -1;                                                         \
        U *width = low + block;                                                             \
        for (Py_ssize_t j = 0; j < block; j++) width[j] -= low[j];                          \
        int outside = OUTSIDE_U(p, n, low, width, block);                                   \
        PyMem_Free(low);                                                                    \
        return !outside;                                                                    \
    }

WITHIN_INT(within_b, int8_t, uint8_t, outside_8)
WITHIN_INT(within_h, int16_t, uint16_t, outside_16)
WITHIN_INT(within_i, int32_t, uint32_t, outside_32)
WITHIN_INT(within_q, int64_t, uint64_t, outside_64)
WITHIN_INT(within_B, uint8_t, uint8_t, outside_8)
WITHIN_INT(within_H, uint16_t, uint16_t, outside_16)
WITHIN_INT(within_I, uint32_t, uint32_t, outside_32)
WITHIN_INT(within_Q, uint64_t, uint64_t, outside_64)
WITHIN_FLOAT(within_f, float, float)
WITHIN_FLOAT(within_d, double, double)
WITHIN_FLOAT(within_fd, float, double)

typedef int (*Within)(const uint8_t *, Py_ssize_t, Py_ssize_t, const uint8_t *, const uint8_t *);

static const struct {
    char type, compare;
    Py_ssize_t size, bound_size;
    Within within;
} WITHINS[] = {
    {'b', 'b', 1, 1, within_b}, {'h', 'h', 2, 2, within_h}, {'i', 'i', 4, 4, within_i},
    {'q', 'q', 8, 8, within_q}, {'B', 'B', 1, 1, within_B}, {'H', 'H', 2, 2, within_H},
    {'I', 'I', 4, 4, within_I}, {'Q', 'Q', 8, 8, within_Q}, {'f', 'f', 4, 4, within_f},
    {'d', 'd', 8, 8, within_d}, {'f', 'd', 4, 8, within_fd},
};

/* Whether the float64 sum of n rewards (float32 or float64) is surely finite
 * in any order of adding: every one finite, and for float64 each at most
 * DBL_MAX / 2n (a larger one takes the general path, whose numpy sum decides). */
static int finite_sum(const uint8_t *p, Py_ssize_t n, int wide) {
    int out = 0;
    if (wide) {
        double limit = DBL_MAX / 2.0 / (double)(n > 0 ? n : 1);
        for (Py_ssize_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            out |= !(fabs(v) <= limit); /* NaN: false */
        }
    } else { /* float32s' sum in float64 overflows for no n a result holds */
        for (Py_ssize_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + 4 * i, 4);
            out |= !(fabsf(v) <= FLT_MAX); /* NaN: false */
        }
    }
    return !out;
}

/* Whether every one of n bytes is 0 or 1 (numpy's bools). */
static int bools_pass(const uint8_t *p, Py_ssize_t n) {
    uint8_t high = 0;
    for (Py_ssize_t i = 0; i < n; i++) high |= p[i] & 0xFE;
    return high == 0;
}

/* One screen of ``spec`` over the array at ``offset``: 1 or 0, -1 with an error set. */
static int screen_pass(const Source *s, PyObject *spec, Py_ssize_t offset, Py_ssize_t episodes,
                       Py_ssize_t steps) {
    if (!PyBytes_Check(spec) || PyBytes_GET_SIZE(spec) < (Py_ssize_t)sizeof(ScreenHead)) {
        PyErr_SetString(PyExc_TypeError, "a screen's spec must be bytes starting with its head");
        return -1;
    }
    ScreenHead head;
    const uint8_t *bound_bytes = (const uint8_t *)PyBytes_AS_STRING(spec) + sizeof head;
    Py_ssize_t bound_room = PyBytes_GET_SIZE(spec) - (Py_ssize_t)sizeof head;
    memcpy(&head, PyBytes_AS_STRING(spec), sizeof head);
    Py_ssize_t size = 1, bound_size = 0;
    Within within = NULL;
    if (head.op == 'w') {
        for (size_t i = 0; i < sizeof WITHINS / sizeof WITHINS[0]; i++)
            if (WITHINS[i].type == head.type && WITHINS[i].compare == head.compare) {
                size = WITHINS[i].size;
                bound_size = WITHINS[i].bound_size;
                within = WITHINS[i].within;
            }
    } else if (head.op == 'f' && (head.type == 'f' || head.type == 'd')) {
        size = head.type == 'd' ? 8 : 4;
    } else if (head.op != 'o' || head.type != '?') {
        size = 0;
    }
    Py_ssize_t rows = head.flags & PER_EPISODE ? episodes : steps;
    int bound_lists = head.op == 'w' ? 2 : 0;
    if (size == 0 || (head.op == 'w' && within == NULL) || head.row < 1 ||
        head.row > PY_SSIZE_T_MAX / size || (head.bounds != 1 && head.bounds != head.row) ||
        (bound_lists && head.bounds > bound_room) ||
        bound_room != bound_lists * head.bounds * bound_size) {
        PyErr_SetString(PyExc_ValueError, "a screen's spec does not hold a screen");
        return -1;
    }
    Py_ssize_t row = (Py_ssize_t)head.row;
    if (rows > PY_SSIZE_T_MAX / (row * size)) return 0; /* not in any result */
    uint8_t *scratch = NULL;
    const uint8_t *p = source_span(s, offset, rows * row * size, &scratch);
    if (p == NULL) return PyErr_Occurred() ? -1 : 0;
    int verdict;
    if (head.op == 'w') {
        Py_ssize_t bounds = (Py_ssize_t)head.bounds;
        verdict = within(p, rows * row, bounds, bound_bytes, bound_bytes + bounds * bound_size);
    } else if (head.op == 'f') {
        verdict = finite_sum(p, rows * row, head.type == 'd');
    } else {
        verdict = bools_pass(p, rows * row);
    }
    PyMem_Free(scratch);
    return verdict;
}

PyDoc_STRVAR(values_pass_doc,
"values_pass(data, screens, offsets, episodes, steps, /)\n"
"--\n\n"
"Whether a result's values pass its layout's screens, read where they lie.\n\n"
"data: the result's bytes, a buffer or a tuple of its chunks' buffers.\n"
"screens: (name, spec) pairs (specs made by rlfleet.wire._layout_frames):\n"
"values within bounds, rewards' finite sum, bools 0 or 1.\n"
"offsets: each array's offset in data, by name.\n"
"episodes, steps: the result's numbers (an array's rows are one or the other).\n"
"False for a value a screen refuses, and for an array not in the result.");

static PyObject *values_pass(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "values_pass takes 5 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *screens = args[1], *offsets = args[2];
    if (!PyTuple_Check(screens) || !PyDict_Check(offsets)) {
        PyErr_SetString(PyExc_TypeError, "screens must be a tuple, offsets a dict");
        return NULL;
    }
    Py_ssize_t episodes = PyLong_AsSsize_t(args[3]), steps = PyLong_AsSsize_t(args[4]);
    if ((episodes == -1 || steps == -1) && PyErr_Occurred()) return NULL;
    if (episodes < 0 || steps < 0) Py_RETURN_FALSE;
    Source source = {NULL, 0, 0};
    if (source_open(args[0], &source) < 0) return NULL;
    int verdict = 1;
    for (Py_ssize_t i = 0; verdict == 1 && i < PyTuple_GET_SIZE(screens); i++) {
        PyObject *screen = PyTuple_GET_ITEM(screens, i);
        if (!PyTuple_Check(screen) || PyTuple_GET_SIZE(screen) != 2) {
            PyErr_SetString(PyExc_TypeError, "each screen must be a (name, spec) pair");
            verdict = -1;
            break;
        }
        PyObject *at = PyDict_GetItemWithError(offsets, PyTuple_GET_ITEM(screen, 0));
        if (at == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "a screen's array has no offset");
            verdict = -1;
            break;
        }
        Py_ssize_t offset = PyLong_AsSsize_t(at);
        if (offset == -1 && PyErr_Occurred()) {
            verdict = -1;
            break;
        }
        verdict = screen_pass(&source, PyTuple_GET_ITEM(screen, 1), offset, episodes, steps);
    }
    source_release(&source);
    if (verdict < 0) return NULL;
    return PyBool_FromLong(verdict);
}

static PyMethodDef module_methods[] = {
    {"episodes_pass", (PyCFunction)(void (*)(void))episodes_pass, METH_FASTCALL,
     episodes_pass_doc},
    {"values_pass", (PyCFunction)(void (*)(void))values_pass, METH_FASTCALL, values_pass_doc},
    {NULL, NULL, 0, NULL},
};


static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_result_check",
    .m_doc = "The byte-level work of a result checked in one pass (rlfleet.wire.result_layout).",
    .m_size = 0,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__result_check(void) { return PyModuleDef_Init(&module_def); }

/* Episodes' seeds derived for a whole column of episode indices in one call
 * (rlfleet.core._seed_hash; used by rlfleet.core.seeding.episode_seed_columns).
 *
 * An episode's (env_seed, policy_seed) is numpy's
 * SeedSequence(prefix + [episode_index]).generate_state(2, uint32): the
 * prefix is the words of the sampler's seed and of the request's index, the
 * same for every unit of a refill. With numpy over the column it took some
 * 30 array operations and about 440 instructions a unit, the largest part of
 * a refill that hands out units; here each unit is one pass of the hash
 * (numpy/random/bit_generator.pyx: mix_entropy over a 4-word pool, then
 * generate_state), with the hash constants, which do not depend on the data,
 * worked out once per call.
 *
 * Checked, whatever the caller: the prefix is a tuple of 1 to MAX_PREFIX
 * exact ints each in [0, 2**32); the indices a 1-D C-contiguous int64 column;
 * the outputs two writable 1-D C-contiguous int64 columns of the indices'
 * length. Anything else raises, writing nothing. An index outside
 * [0, 2**32) (not one entropy word) makes the call answer False, writing
 * nothing: its seeds are the reference's to derive (or refuse).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* SeedSequence's constants (numpy/random/bit_generator.pyx). */
#define POOL_SIZE 4
#define INIT_A 0x43B0D7E5u
#define MULT_A 0x931E8875u
#define INIT_B 0x8B51F9DDu
#define MULT_B 0x58F38DEDu
#define MIX_MULT_L 0xCA01F9DDu
#define MIX_MULT_R 0x4973F715u
#define XSHIFT 16

/* Entropy words before the episode index: the base seed's and the request's,
 * at most two each. */
#define MAX_PREFIX 8
/* hashmix calls of mix_entropy: one per pool word, the pool's cross-mixing,
 * then one per pool word for each entropy word past the pool. */
#define MAX_HASHES (POOL_SIZE + POOL_SIZE * (POOL_SIZE - 1) + POOL_SIZE * (MAX_PREFIX + 1))

/* hashmix with the hash constant it starts from (`constant`) and the one it
 * leaves (`next`, constant * MULT_A), both worked out beforehand. */
static inline uint32_t hashmix(uint32_t value, uint32_t constant, uint32_t next) {
    value = (value ^ constant) * next;
    return value ^ (value >> XSHIFT);
}

static inline uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = MIX_MULT_L * x - MIX_MULT_R * y;
    return result ^ (result >> XSHIFT);
}

/* A 1-D C-contiguous int64 column ("q"/"l"), writable if asked. */
static int get_column(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format;
    if (f != NULL && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f++;
    if (view->ndim != 1 || view->itemsize != 8 || f == NULL || f[0] == '\0' || f[1] != '\0' ||
        (f[0] != 'q' && f[0] != 'l')) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D C-contiguous int64 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(seed_pairs_doc,
"seed_pairs(prefix, indices, env_out, policy_out) -> bool\n"
"\n"
"SeedSequence([*prefix, index]).generate_state(2, uint32) for every index,\n"
"its two words written to env_out and policy_out at the index's position:\n"
"True. False, writing nothing, if an index is outside [0, 2**32).\n"
"prefix: a tuple of 1 to 8 ints in [0, 2**32); indices: a 1-D int64 array;\n"
"env_out, policy_out: writable 1-D int64 arrays of the indices' length.\n"
"Raises TypeError or ValueError, writing nothing, otherwise.");

static PyObject *seed_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "seed_pairs takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyTuple_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "seed_pairs' prefix must be a tuple of ints");
        return NULL;
    }
    Py_ssize_t words = PyTuple_GET_SIZE(args[0]);
    if (words < 1 || words > MAX_PREFIX) {
        PyErr_Format(PyExc_ValueError, "seed_pairs' prefix holds 1 to %d words, got %zd",
                     MAX_PREFIX, words);
        return NULL;
    }
    uint32_t prefix[MAX_PREFIX];
    for (Py_ssize_t k = 0; k < words; k++) {
        PyObject *item = PyTuple_GET_ITEM(args[0], k);
        if (!PyLong_CheckExact(item)) {
            PyErr_SetString(PyExc_TypeError, "seed_pairs' prefix must be a tuple of ints");
            return NULL;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (overflow || v < 0 || v > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "seed_pairs' prefix word %zd is not in [0, 2**32)", k);
            return NULL;
        }
        prefix[k] = (uint32_t)v;
    }

    Py_buffer in, env, policy;
    if (get_column(args[1], &in, 0, "indices") < 0) return NULL;
    if (get_column(args[2], &env, 1, "env_out") < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    if (get_column(args[3], &policy, 1, "policy_out") < 0) {
        PyBuffer_Release(&env);
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *answer = NULL;
    Py_ssize_t n = in.shape[0];
    const int64_t *indices = in.buf;
    int64_t *env_seeds = env.buf, *policy_seeds = policy.buf;
    if (env.shape[0] != n || policy.shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "seed_pairs' outputs hold %zd and %zd values for %zd indices",
                     env.shape[0], policy.shape[0], n);
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (indices[k] < 0 || indices[k] > 0xFFFFFFFFLL) {
            answer = Py_NewRef(Py_False);
            goto done;
        }
    }

    /* The entropy words are the prefix then the index (at position `words`).
     * Every hash constant mix_entropy uses, in order: each is the one before
     * times MULT_A, from INIT_A; hashmix uses it before and after that step,
     * so consts[h] is the one hashmix h starts from. */
    Py_ssize_t entropy = words + 1;
    Py_ssize_t hashes = POOL_SIZE + POOL_SIZE * (POOL_SIZE - 1) +
                        (entropy > POOL_SIZE ? POOL_SIZE * (entropy - POOL_SIZE) : 0);
    uint32_t consts[MAX_HASHES + 1];
    consts[0] = INIT_A;
    for (Py_ssize_t h = 0; h < hashes; h++) consts[h + 1] = consts[h] * MULT_A;
    /* The pool's first words hash the prefix (and zeros past the entropy):
     * the same for every unit, but for the index's own word if it is in the
     * pool. */
    uint32_t start[POOL_SIZE];
    for (int i = 0; i < POOL_SIZE; i++) {
        start[i] = hashmix(i < words ? prefix[i] : 0u, consts[i], consts[i + 1]);
    }
    uint32_t out_b0 = INIT_B, out_b1 = INIT_B * MULT_B;

    for (Py_ssize_t k = 0; k < n; k++) {
        uint32_t index = (uint32_t)indices[k];
        uint32_t mixer[POOL_SIZE];
        memcpy(mixer, start, sizeof mixer);
        if (words < POOL_SIZE) mixer[words] = hashmix(index, consts[words], consts[words + 1]);
        Py_ssize_t h = POOL_SIZE;
        for (int src = 0; src < POOL_SIZE; src++) {
            for (int dst = 0; dst < POOL_SIZE; dst++) {
                if (src != dst) {
                    mixer[dst] = mix(mixer[dst], hashmix(mixer[src], consts[h], consts[h + 1]));
                    h++;
                }
            }
        }
        for (Py_ssize_t src = POOL_SIZE; src < entropy; src++) {
            uint32_t word = src < words ? prefix[src] : index;
            for (int dst = 0; dst < POOL_SIZE; dst++) {
                mixer[dst] = mix(mixer[dst], hashmix(word, consts[h], consts[h + 1]));
                h++;
            }
        }
        /* generate_state(2): pool words 0 and 1, each through its constant. */
        uint32_t first = (mixer[0] ^ out_b0) * (out_b0 * MULT_B);
        uint32_t second = (mixer[1] ^ out_b1) * (out_b1 * MULT_B);
        env_seeds[k] = (int64_t)(first ^ (first >> XSHIFT));
        policy_seeds[k] = (int64_t)(second ^ (second >> XSHIFT));
    }
    answer = Py_NewRef(Py_True);

done:
    PyBuffer_Release(&policy);
    PyBuffer_Release(&env);
    PyBuffer_Release(&in);
    return answer;
}

static PyMethodDef module_methods[] = {
    {"seed_pairs", (PyCFunction)(void (*)(void))seed_pairs, METH_FASTCALL, seed_pairs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_seed_hash",
    .m_doc = "Episodes' seeds derived for a column of episode indices in one call "
             "(rlfleet.core.seeding).",
    .m_size = 0,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__seed_hash(void) { return PyModuleDef_Init(&module_def); }

/* The attention's reads of a KV cache row, for each cache type (cache/kv_types.py): a query
 * row's dot with a stored K row, and a stored V row's weighted add into the output, straight
 * from the stored bytes (no f32 copy of the row).
 *
 *   f32   floats;  f16  IEEE halves;  bf16  the f32's high 16 bits;
 *   q8_0  blocks of 32: an f16 scale d, then 32 int8 q; element = q * d;
 *   q4_0  blocks of 32: an f16 scale d, then 16 bytes, element j the low nibble of byte j,
 *         element j + 16 its high nibble; element = (nibble - 8) * d.
 *
 * Each element is decoded to exactly the float kv_types.decode gives (a half widened
 * exactly; q * d one rounding, as NumPy's q.astype(f32) * d), and then used as an f32 row
 * is: the dot sums in dot_lanes' order (8 lanes, each every 8th product in order, a tree,
 * then the tail), the add is out[d] += e * v[d]. So a typed row gives the bits the f32
 * kernel gives on its decoded row, whatever rows, chunk, thread count or instruction set
 * (the build has -ffp-contract=off: no fused multiply-add changes a rounding).
 *
 * Included by rowwise.c after its bits_to_float / float_to_bits and its rows_of / get_rows. */

#ifndef FRINK_ROWWISE_KV_H
#define FRINK_ROWWISE_KV_H

#include <stdint.h>

/* The cache types, by the numbers rowwise.py passes (its KV_TYPES). */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_Q8_0 = 3, KV_Q4_0 = 4 };
#define KV_BLOCK 32

/* Bytes one stored element takes (f32 / f16 / bf16), or one block (q8_0 / q4_0). */
static inline Py_ssize_t kv_stored_width(int type, Py_ssize_t width) {
    switch (type) {
    case KV_Q8_0: return width / KV_BLOCK * (2 + KV_BLOCK);
    case KV_Q4_0: return width / KV_BLOCK * (2 + KV_BLOCK / 2);
    default: return width;
    }
}

/* An IEEE half as the float it is exactly, branch-free (so a loop of it vectorizes): the
 * half's exponent and mantissa put in a float's bits and scaled by 2^112 (exact for normal
 * and subnormal halves alike), infinities and NaNs given the float's all-ones exponent. */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t em = (uint32_t)(h & 0x7fff);
    uint32_t u = float_to_bits(bits_to_float(em << 13) * 0x1p112f);
    u |= em >= 0x7c00 ? 0x7f800000u : 0u;
    return bits_to_float(u | ((uint32_t)(h & 0x8000) << 16));
}

static inline float bf16_to_f32(uint16_t h) { return bits_to_float((uint32_t)h << 16); }

/* A q8_0 / q4_0 block's scale (little-endian f16 bytes). */
static inline float block_scale(const uint8_t *b) {
    return f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
}

/* The tree dot_lanes adds its 8 lanes by. */
static inline float lanes_sum(const float *lane) {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* a . b over n floats: 8 lanes, each summing every 8th product in order, added as a tree, then
 * the last n % 8 products one by one. One order for every n, row and instruction set. */
static inline float dot_lanes(const float *a, const float *b, Py_ssize_t n) {
    float lane[8] = {0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
    float s = lanes_sum(lane);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* dot_lanes with b a row of 16-bit floats (bf16: nonzero), widened as they are read. */
static inline float dot_half(const float *a, const uint16_t *b, Py_ssize_t n, int bf16) {
    float lane[8] = {0};
    Py_ssize_t i = 0;
    if (bf16)
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) lane[l] += a[i + l] * bf16_to_f32(b[i + l]);
    else
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) lane[l] += a[i + l] * f16_to_f32(b[i + l]);
    float s = lanes_sum(lane);
    for (; i < n; i++) s += a[i] * (bf16 ? bf16_to_f32(b[i]) : f16_to_f32(b[i]));
    return s;
}

/* dot_lanes with b a row of q8_0 / q4_0 blocks (n a multiple of 32: no tail). */
static inline float dot_blocks(const float *a, const uint8_t *b, Py_ssize_t n, int q4) {
    float lane[8] = {0};
    const Py_ssize_t size = q4 ? 2 + KV_BLOCK / 2 : 2 + KV_BLOCK;
    for (Py_ssize_t i = 0; i < n; i += KV_BLOCK, b += size) {
        const float d = block_scale(b), *x = a + i;
        float v[KV_BLOCK];
        if (q4)
            for (int j = 0; j < KV_BLOCK / 2; j++) {
                v[j] = (float)((int)(b[2 + j] & 0x0F) - 8) * d;
                v[j + KV_BLOCK / 2] = (float)((int)(b[2 + j] >> 4) - 8) * d;
            }
        else
            for (int j = 0; j < KV_BLOCK; j++) v[j] = (float)(int8_t)b[2 + j] * d;
        for (int j = 0; j < KV_BLOCK; j += 8)
            for (int l = 0; l < 8; l++) lane[l] += x[j + l] * v[j + l];
    }
    return lanes_sum(lane);
}

/* q . (stored K row) for cache type `type`, n the row's width in values. */
static inline float dot_key(int type, const float *q, const char *row, Py_ssize_t n) {
    switch (type) {
    case KV_F16: return dot_half(q, (const uint16_t *)row, n, 0);
    case KV_BF16: return dot_half(q, (const uint16_t *)row, n, 1);
    case KV_Q8_0: return dot_blocks(q, (const uint8_t *)row, n, 0);
    case KV_Q4_0: return dot_blocks(q, (const uint8_t *)row, n, 1);
    default: return dot_lanes(q, (const float *)row, n);
    }
}

/* out[d] += e * (stored V row)[d] over its n values, for cache type `type`. */
static inline void add_value(int type, float *out, float e, const char *row, Py_ssize_t n) {
    if (type == KV_F32) {
        const float *v = (const float *)row;
        for (Py_ssize_t d = 0; d < n; d++) out[d] += e * v[d];
    } else if (type == KV_F16 || type == KV_BF16) {
        const uint16_t *v = (const uint16_t *)row;
        if (type == KV_BF16)
            for (Py_ssize_t d = 0; d < n; d++) out[d] += e * bf16_to_f32(v[d]);
        else
            for (Py_ssize_t d = 0; d < n; d++) out[d] += e * f16_to_f32(v[d]);
    } else {
        const int q4 = type == KV_Q4_0;
        const Py_ssize_t size = q4 ? 2 + KV_BLOCK / 2 : 2 + KV_BLOCK;
        const uint8_t *b = (const uint8_t *)row;
        for (Py_ssize_t i = 0; i < n; i += KV_BLOCK, b += size) {
            const float d = block_scale(b);
            float *o = out + i;
            if (q4)
                for (int j = 0; j < KV_BLOCK / 2; j++) {
                    o[j] += e * ((float)((int)(b[2 + j] & 0x0F) - 8) * d);
                    o[j + KV_BLOCK / 2] += e * ((float)((int)(b[2 + j] >> 4) - 8) * d);
                }
            else
                for (int j = 0; j < KV_BLOCK; j++) o[j] += e * ((float)(int8_t)b[2 + j] * d);
        }
    }
}

/* obj as a cache type's stored rows: f32 as floats, f16 as halves (NumPy's "e") or their
 * bits, bf16 as uint16, q8_0 / q4_0 as bytes. */
static int get_stored_rows(PyObject *obj, int type, const char *what, rows_of *r) {
    switch (type) {
    case KV_F32: return get_rows(obj, 0, what, r);
    case KV_F16: return get_rows_of(obj, 0, what, "eH", 2, r);
    case KV_BF16: return get_rows_of(obj, 0, what, "H", 2, r);
    case KV_Q8_0:
    case KV_Q4_0: return get_rows_of(obj, 0, what, "B", 1, r);
    default: PyErr_Format(PyExc_ValueError, "%s: unknown cache type %d", what, type); return -1;
    }
}

/* The stored row i of r (its bytes): row i % b of head i / b, through r's page table where
 * it has one. */
static inline const char *stored_at(const rows_of *r, Py_ssize_t i) {
    Py_ssize_t j = i % r->b;
    if (r->table) j = (Py_ssize_t)r->table[j / r->page] * r->page + j % r->page;
    return r->base + (i / r->b) * r->sa + j * r->sb;
}

/* A head's rows from row `base` of r on (stored_at's rows base + i, all in base's head):
 * the head's address found once, where stored_at divides for every row. */
typedef struct {
    const rows_of *r;
    const char *head;
    Py_ssize_t j;
} kv_rows;

static inline kv_rows kv_rows_from(const rows_of *r, Py_ssize_t base) {
    return (kv_rows){r, r->base + (base / r->b) * r->sa, base % r->b};
}

/* stored_at(r, base + i) of kv_rows_from(r, base). */
static inline const char *kv_row(const kv_rows *c, Py_ssize_t i) {
    Py_ssize_t j = c->j + i;
    if (c->r->table) j = (Py_ssize_t)c->r->table[j / c->r->page] * c->r->page + j % c->r->page;
    return c->head + j * c->r->sb;
}

/* Whether a stored row of `stored` elements is not one of `width` values of cache type
 * `type` (q8_0 / q4_0 rows are whole blocks). */
static int kv_widths_differ(int type, Py_ssize_t width, Py_ssize_t stored) {
    if ((type == KV_Q8_0 || type == KV_Q4_0) && width % KV_BLOCK) return 1;
    return kv_stored_width(type, width) != stored;
}

#endif

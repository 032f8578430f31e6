#include "gguf_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/qblock.h"
#include "ckpt/gguf.h"
#include "ckpt/tensormap.h"

typedef struct {
    const char *key;
    size_t key_len;
    uint32_t type;
    const unsigned char *val; /* the value; for arrays, its first element */
    uint32_t elem;            /* arrays: element type */
    uint64_t count;           /* arrays: element count */
} kv_t;

struct loom_gguf {
    char *path;
    const unsigned char *p;
    size_t size, at;
    int short_read;
    uint32_t version;
    uint64_t nkv, nt, align;
    kv_t *kv;
    loom_gguf_tensor_t *t;
    size_t data; /* start of the data section */
};

#define READS "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K and q6_K"

/* Values per block and bytes per block of a type loom reads; 0 if not. */
static int type_shape(uint32_t ggml, int *block, int *bytes, const char **name) {
    static const struct { uint32_t t; int block, bytes; const char *name; } plain[] = {
        {LOOM_GT_F32, 1, 4, "f32"}, {LOOM_GT_F16, 1, 2, "f16"}, {LOOM_GT_BF16, 1, 2, "bf16"}, {LOOM_GT_Q8_0, 32, 34, "q8_0"}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (plain[i].t == ggml) return *block = plain[i].block, *bytes = plain[i].bytes, *name = plain[i].name, 1;
    int d = loom_qblock_of_ggml(ggml);
    if (d < 0) return 0;
    const loom_qblock_info_t *q = loom_qblock_info((loom_dtype)d);
    return *block = q->block, *bytes = q->bytes, *name = q->name, 1;
}

const char *loom_gguf_type_name(uint32_t ggml) {
    int b, n;
    const char *name;
    return type_shape(ggml, &b, &n, &name) ? name : NULL;
}

/* ---- the byte reader ---- */

static const unsigned char *take(loom_gguf_t *g, size_t n) {
    if (g->short_read || n > g->size - g->at) {
        g->short_read = 1;
        return NULL;
    }
    const unsigned char *q = g->p + g->at;
    g->at += n;
    return q;
}
static uint32_t get_u32(loom_gguf_t *g) {
    uint32_t v = 0;
    const unsigned char *q = take(g, 4);
    if (q) memcpy(&v, q, 4);
    return v;
}
static uint64_t get_u64(loom_gguf_t *g) {
    uint64_t v = 0;
    const unsigned char *q = take(g, 8);
    if (q) memcpy(&v, q, 8);
    return v;
}

static size_t scalar_size(uint32_t type) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type <= LOOM_GV_F64 ? sz[type] : 0;
}

/* Step over one value of `type` (strings and nested arrays included). */
static int skip_value(loom_gguf_t *g, uint32_t type, int depth) {
    if (type == LOOM_GV_STR) return take(g, get_u64(g)) != NULL;
    if (type == LOOM_GV_ARR) {
        uint32_t elem = get_u32(g);
        uint64_t n = get_u64(g);
        if (depth > 4 || elem > LOOM_GV_F64) return 0;
        if (elem != LOOM_GV_STR && elem != LOOM_GV_ARR) return n <= g->size && take(g, n * scalar_size(elem)) != NULL;
        for (uint64_t i = 0; i < n && !g->short_read; i++)
            if (!skip_value(g, elem, depth + 1)) return 0;
        return !g->short_read;
    }
    return scalar_size(type) && take(g, scalar_size(type)) != NULL;
}

static loom_status parse_kv(loom_gguf_t *g) {
    g->kv = loom_calloc(g->nkv ? g->nkv : 1, sizeof *g->kv);
    for (uint64_t i = 0; i < g->nkv; i++) {
        kv_t *k = &g->kv[i];
        k->key_len = get_u64(g);
        k->key = (const char *)take(g, k->key_len);
        k->type = get_u32(g);
        if (g->short_read) break;
        k->val = g->p + g->at;
        if (k->type == LOOM_GV_ARR) {
            size_t save = g->at;
            k->elem = get_u32(g);
            k->count = get_u64(g);
            k->val = g->p + g->at;
            g->at = save;
        }
        if (!skip_value(g, k->type, 0))
            return loom_error(LOOM_EFORMAT, "%s: metadata %.*s (type %u) is malformed or cut short; the file is truncated or not GGUF", g->path,
                              (int)(k->key ? k->key_len : 0), k->key ? k->key : "", k->type);
    }
    if (g->short_read) return loom_error(LOOM_EFORMAT, "%s: the metadata ends past the end of the file (%zu bytes); the file is truncated", g->path, g->size);
    return LOOM_OK;
}

static const kv_t *kv_find(const loom_gguf_t *g, const char *key) {
    for (uint64_t i = 0; i < g->nkv; i++)
        if (g->kv[i].key_len == strlen(key) && !memcmp(g->kv[i].key, key, g->kv[i].key_len)) return &g->kv[i];
    return NULL;
}

int loom_gguf_int(const loom_gguf_t *g, const char *key, long long *out) {
    const kv_t *k = kv_find(g, key);
    if (!k) return 0;
    uint64_t u = 0;
    switch (k->type) {
    case LOOM_GV_U8: case LOOM_GV_BOOL: u = k->val[0]; break;
    case LOOM_GV_I8: u = (uint64_t)(int64_t)(int8_t)k->val[0]; break;
    case LOOM_GV_U16: { uint16_t v; memcpy(&v, k->val, 2); u = v; break; }
    case LOOM_GV_I16: { int16_t v; memcpy(&v, k->val, 2); u = (uint64_t)(int64_t)v; break; }
    case LOOM_GV_U32: { uint32_t v; memcpy(&v, k->val, 4); u = v; break; }
    case LOOM_GV_I32: { int32_t v; memcpy(&v, k->val, 4); u = (uint64_t)(int64_t)v; break; }
    case LOOM_GV_U64: case LOOM_GV_I64: memcpy(&u, k->val, 8); break;
    default: return 0;
    }
    *out = (long long)u;
    return 1;
}

int loom_gguf_float(const loom_gguf_t *g, const char *key, double *out) {
    const kv_t *k = kv_find(g, key);
    if (k && k->type == LOOM_GV_F32) {
        float f;
        memcpy(&f, k->val, 4);
        return *out = f, 1;
    }
    if (k && k->type == LOOM_GV_F64) return memcpy(out, k->val, 8), 1;
    return 0;
}

char *loom_gguf_str(const loom_gguf_t *g, const char *key) {
    const kv_t *k = kv_find(g, key);
    if (!k || k->type != LOOM_GV_STR) return NULL;
    uint64_t n;
    memcpy(&n, k->val, 8);
    char *s = loom_malloc(n + 1);
    memcpy(s, k->val + 8, n);
    s[n] = 0;
    return s;
}

int loom_gguf_array(const loom_gguf_t *g, const char *key, loom_gguf_array_t *a) {
    const kv_t *k = kv_find(g, key);
    if (!k || k->type != LOOM_GV_ARR) return 0;
    *a = (loom_gguf_array_t){k->elem, k->count, k->val};
    return 1;
}

const unsigned char *loom_gguf_next_str(const loom_gguf_t *g, const unsigned char **cur, uint64_t *len) {
    if ((size_t)(*cur - g->p) + 8 > g->size) return NULL;
    memcpy(len, *cur, 8);
    const unsigned char *s = *cur + 8;
    if (*len > g->size - (size_t)(s - g->p)) return NULL;
    *cur = s + *len;
    return s;
}

/* ---- tensors ---- */

static loom_status parse_tensors(loom_gguf_t *g) {
    g->t = loom_calloc(g->nt ? g->nt : 1, sizeof *g->t);
    for (uint64_t i = 0; i < g->nt && !g->short_read; i++) {
        loom_gguf_tensor_t *t = &g->t[i];
        uint64_t n = get_u64(g);
        const unsigned char *name = take(g, n);
        if (name) snprintf(t->name, sizeof t->name, "%.*s", (int)(n < 95 ? n : 95), name);
        t->ndim = get_u32(g);
        if (t->ndim > 4 || (t->ndim == 0 && !g->short_read))
            return loom_error(LOOM_EFORMAT, "%s: tensor %s has %u dimensions; GGUF allows 1 to 4 (the file is corrupt)", g->path, t->name, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) t->ne[d] = get_u64(g);
        t->type = get_u32(g);
        t->offset = get_u64(g);
    }
    if (g->short_read) return loom_error(LOOM_EFORMAT, "%s: the tensor list ends past the end of the file (%zu bytes); the file is truncated", g->path, g->size);
    long long align = LOOM_GGUF_ALIGN;
    loom_gguf_int(g, "general.alignment", &align);
    if (align <= 0 || align > (1 << 20) || (align & (align - 1)))
        return loom_error(LOOM_EFORMAT, "%s: metadata general.alignment %lld is not a power of two up to 2^20", g->path, align);
    g->align = (uint64_t)align;
    g->data = (g->at + (size_t)align - 1) / (size_t)align * (size_t)align;
    return LOOM_OK;
}

/* One tensor on its own: type, shape, size, alignment, extent. */
static loom_status check_tensor(loom_gguf_t *g, loom_gguf_tensor_t *t) {
    int block, bytes;
    const char *tn;
    if (!type_shape(t->type, &block, &bytes, &tn))
        return loom_error(LOOM_EUNAVAIL, "%s: tensor %s has ggml type %u, which loom does not read; loom reads " READS
                          " (re-quantize the original model with llama-quantize to Q4_K_M, Q5_K_M, Q6_K or Q8_0)", g->path, t->name, t->type);
    t->numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->ne[d] > ((uint64_t)1 << 40) || (t->ne[d] && t->numel > ((uint64_t)1 << 40) / t->ne[d]))
            return loom_error(LOOM_EFORMAT, "%s: tensor %s: dimension %u (%llu) makes it too large; the file is corrupt", g->path,
                              t->name, d, (unsigned long long)t->ne[d]);
        t->numel *= t->ne[d];
    }
    if (t->ne[0] % (uint64_t)block)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: type %s stores rows in blocks of %d values but its rows have %llu; the type does not match the shape (the file is corrupt)",
                          g->path, t->name, tn, block, (unsigned long long)t->ne[0]);
    t->bytes = (size_t)(t->numel / (uint64_t)block * (uint64_t)bytes);
    if (t->offset % g->align)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: offset %llu is not a multiple of the alignment %llu; the file is corrupt", g->path,
                          t->name, (unsigned long long)t->offset, (unsigned long long)g->align);
    if (g->data > g->size || t->offset > g->size - g->data || t->bytes > g->size - g->data - t->offset)
        return loom_error(LOOM_EFORMAT, "%s: the file is truncated: it ends inside tensor %s: its %zu bytes (%s) at offset %llu end past the end of the file (%zu bytes); the download or copy is incomplete, fetch the file again",
                          g->path, t->name, t->bytes, tn, (unsigned long long)(g->data + t->offset), g->size);
    t->data = g->p + g->data + t->offset;
    return LOOM_OK;
}

static const loom_gguf_tensor_t *sort_base;
static int by_offset(const void *a, const void *b) {
    const loom_gguf_tensor_t *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Tensors against each other: names, overlaps, and the span each has. */
static loom_status check_layout(loom_gguf_t *g) {
    int n = (int)g->nt, *ord = loom_malloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) ord[i] = i;
    sort_base = g->t;
    qsort(ord, (size_t)n, sizeof(int), by_offset);
    loom_status s = LOOM_OK;
    for (int k = 0; k < n && s == LOOM_OK; k++) {
        const loom_gguf_tensor_t *a = &g->t[ord[k]], *b = k + 1 < n ? &g->t[ord[k + 1]] : NULL;
        uint64_t end = a->offset + a->bytes, next = b ? b->offset : (uint64_t)(g->size - g->data);
        if (b && b->offset == a->offset && (a->bytes || b->bytes))
            s = loom_error(LOOM_EFORMAT, "%s: tensors %s and %s both start at offset %llu; the file is corrupt (convert the model again)", g->path,
                           a->name, b->name, (unsigned long long)a->offset);
        else if (b && next < end)
            s = loom_error(LOOM_EFORMAT, "%s: tensors %s (bytes %llu to %llu) and %s (from %llu) overlap; the file is corrupt (convert the model again)",
                           g->path, a->name, (unsigned long long)a->offset, (unsigned long long)end, b->name, (unsigned long long)next);
        else if (next - end >= g->align)
            s = loom_error(LOOM_EFORMAT, "%s: tensor %s: its type %s and shape make %zu bytes but the file gives it %llu (up to %s); the type does not match the data (convert the model again)",
                           g->path, a->name, loom_gguf_type_name(a->type), a->bytes, (unsigned long long)(next - a->offset),
                           b ? b->name : "the end of the file");
    }
    for (int i = 0; i < n && s == LOOM_OK; i++)
        for (int j = i + 1; j < n && s == LOOM_OK; j++)
            if (!strcmp(g->t[i].name, g->t[j].name))
                s = loom_error(LOOM_EFORMAT, "%s: tensor %s appears twice; the file is corrupt (convert the model again)", g->path, g->t[i].name);
    free(ord);
    return s;
}

static loom_status parse(loom_gguf_t *g) {
    uint32_t magic = get_u32(g);
    if (g->short_read || magic != LOOM_GGUF_MAGIC)
        return loom_error(LOOM_EFORMAT, "%s: not a GGUF file (magic %08x, expected %08x \"GGUF\")", g->path, magic, LOOM_GGUF_MAGIC);
    g->version = get_u32(g);
    if (g->version != 2 && g->version != 3)
        return loom_error(LOOM_EFORMAT, "%s: GGUF version %u is not supported; loom reads versions 2 and 3 (convert it again with a current llama.cpp)",
                          g->path, g->version);
    g->nt = get_u64(g);
    g->nkv = get_u64(g);
    if (g->short_read || g->nt > g->size || g->nkv > g->size)
        return loom_error(LOOM_EFORMAT, "%s: the GGUF header is cut short or corrupt (%llu tensors, %llu metadata entries)", g->path,
                          (unsigned long long)g->nt, (unsigned long long)g->nkv);
    LOOM_TRY(parse_kv(g));
    LOOM_TRY(parse_tensors(g));
    for (uint64_t i = 0; i < g->nt; i++) LOOM_TRY(check_tensor(g, &g->t[i]));
    return check_layout(g);
}

loom_status loom_gguf_open(loom_gguf_t **out, const char *path) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    fstat(fd, &sb);
    void *map = sb.st_size > 0 ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return loom_error(LOOM_EFORMAT, "%s: empty or unreadable; not a GGUF file", path);
    loom_gguf_t *g = loom_calloc(1, sizeof *g);
    g->path = loom_strdup(path), g->p = map, g->size = (size_t)sb.st_size;
    loom_status s = parse(g);
    if (s != LOOM_OK) {
        loom_gguf_close(g);
        return s;
    }
    *out = g;
    return LOOM_OK;
}

void loom_gguf_close(loom_gguf_t *g) {
    if (!g) return;
    munmap((void *)g->p, g->size);
    free(g->kv);
    free(g->t);
    free(g->path);
    free(g);
}

const char *loom_gguf_path(const loom_gguf_t *g) { return g->path; }
int loom_gguf_ntensors(const loom_gguf_t *g) { return (int)g->nt; }
const loom_gguf_tensor_t *loom_gguf_tensor_at(const loom_gguf_t *g, int i) { return &g->t[i]; }

const loom_gguf_tensor_t *loom_gguf_find(const loom_gguf_t *g, const char *name) {
    for (uint64_t i = 0; i < g->nt; i++)
        if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

/* The whole pages of the mapping in [p, p + n), or 0 when none. */
static size_t inner_pages(const void *p, size_t n, uintptr_t *a) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), b = ((uintptr_t)p + n) & ~(page - 1);
    *a = ((uintptr_t)p + page - 1) & ~(page - 1);
    return b > *a ? b - *a : 0;
}

void loom_gguf_prefetch(const loom_gguf_t *g) {
    uintptr_t a;
    size_t n = inner_pages(g->p + g->data, g->size - g->data, &a);
    if (n) madvise((void *)a, n, MADV_WILLNEED); /* a hint: the read-ahead of a file not yet in the page cache */
}

void loom_gguf_drop(const void *p, size_t bytes) {
    uintptr_t a;
    size_t n = inner_pages(p, bytes, &a);
    if (n) madvise((void *)a, n, MADV_DONTNEED); /* read-only file pages: dropped from this process, kept in the page cache */
}

void loom_gguf_values(const loom_gguf_tensor_t *t, float *out) {
    int d = loom_qblock_of_ggml(t->type);
    if (d >= 0) {
        loom_qblock_dequantize((loom_dtype)d, t->data, (size_t)t->numel, out);
        return;
    }
    loom_xdtype x = t->type == LOOM_GT_F16 ? LOOM_XDT_F16 : t->type == LOOM_GT_BF16 ? LOOM_XDT_BF16
                  : t->type == LOOM_GT_Q8_0 ? LOOM_XDT_Q8_0 : LOOM_XDT_F32;
    loom_xdecode(x, t->data, (size_t)t->numel, out);
}

/* bpe_nfc: Unicode Normalization Form C, the normalizer of Qwen2's
 * tokenizer.json: canonical decomposition, canonical ordering, canonical
 * composition (UAX #15), with tables generated from Hugging Face
 * `tokenizers` (tests/tokenizer_gen_nfc.py) and Hangul computed. Bytes
 * that are not valid UTF-8 pass through unchanged and block composition
 * across them. */
#ifndef LOOM_BPE_NFC_H
#define LOOM_BPE_NFC_H

#include <stddef.h>
#include <stdint.h>

#include "bpe_unicode.h"

typedef struct {
    uint32_t cp, off, len; /* loom_nfc_pool[off .. off + len) */
} loom_nfc_decomp_t;
typedef struct {
    uint32_t a, b, c;
} loom_nfc_comp_t;
typedef loom_unicode_range_t loom_nfc_ccc_t; /* val: the canonical combining class */

extern const loom_nfc_decomp_t loom_nfc_decomps[];
extern const int loom_nfc_ndecomps;
extern const uint32_t loom_nfc_pool[];
extern const loom_nfc_comp_t loom_nfc_comps[];
extern const int loom_nfc_ncomps;
extern const loom_nfc_ccc_t loom_nfc_cccs[];
extern const int loom_nfc_ncccs;

/* NFC of s[0..n) into *out (malloc'd or grown, *cap its size); returns the
 * length. Text that is ASCII comes back as it is, without a copy made
 * slower than memcpy. */
size_t loom_nfc(const unsigned char *s, size_t n, unsigned char **out, size_t *cap);

#endif

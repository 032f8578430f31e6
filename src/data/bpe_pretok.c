#include "bpe_pretok.h"

#include <pthread.h>
#include <stdint.h>

#include "bpe_unicode.h"

/* Classes of the Basic Multilingual Plane, filled once from the range
 * table; code points above it are looked up by binary search. */
static uint8_t bmp_class[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void bmp_init(void) {
    for (int k = 0; k < loom_unicode_nranges && loom_unicode_ranges[k].lo < 0x10000; k++)
        for (uint32_t c = loom_unicode_ranges[k].lo; c <= loom_unicode_ranges[k].hi && c < 0x10000; c++)
            bmp_class[c] = loom_unicode_ranges[k].val;
}

int loom_unicode_range_find(const loom_unicode_range_t *r, int n, uint32_t cp, int none) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return r[mid].val;
    }
    return none;
}

/* ASCII classes, so the common case needs neither decoding nor a lookup. */
static const uint8_t ascii_class[128] = {
    ['\t'] = LOOM_CC_SPACE, ['\n'] = LOOM_CC_SPACE, ['\v'] = LOOM_CC_SPACE, ['\f'] = LOOM_CC_SPACE,
    ['\r'] = LOOM_CC_SPACE, [' '] = LOOM_CC_SPACE,
    ['0'] = 2, ['1'] = 2, ['2'] = 2, ['3'] = 2, ['4'] = 2, ['5'] = 2, ['6'] = 2, ['7'] = 2, ['8'] = 2, ['9'] = 2,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1,
    ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1,
    ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1,
    ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
    ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

int loom_pretok_class(unsigned cp) {
    if (cp < 128) return ascii_class[cp];
    if (cp < 0x10000) {
        pthread_once(&bmp_once, bmp_init);
        return bmp_class[cp];
    }
    return cp > 0x10FFFF ? LOOM_CC_OTHER : loom_unicode_range_find(loom_unicode_ranges, loom_unicode_nranges, cp, LOOM_CC_OTHER);
}

static inline int cont(unsigned char c) { return (c & 0xC0) == 0x80; }

int loom_utf8_next(const unsigned char *s, size_t len, size_t i, unsigned *cp) {
    unsigned c = s[i];
    size_t left = len - i;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF && left >= 2 && cont(s[i + 1])) {
        *cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF && left >= 3 && cont(s[i + 1]) && cont(s[i + 2])) {
        unsigned v = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3F);
        if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) {
            *cp = v;
            return 3;
        }
    }
    if (c >= 0xF0 && c <= 0xF4 && left >= 4 && cont(s[i + 1]) && cont(s[i + 2]) && cont(s[i + 3])) {
        unsigned v = ((c & 0x07) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3F);
        if (v >= 0x10000 && v <= 0x10FFFF) {
            *cp = v;
            return 4;
        }
    }
    *cp = 0xFFFFFFFFu;
    return 1;
}

size_t loom_utf8_put(unsigned char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* Class and length of the character at s[i]. */
static inline int char_at(const unsigned char *s, size_t len, size_t i, int *cls) {
    if (s[i] < 0x80) {
        *cls = ascii_class[s[i]];
        return 1;
    }
    unsigned cp;
    int n = loom_utf8_next(s, len, i, &cp);
    *cls = loom_pretok_class(cp);
    return n;
}

/* End of the run of class `cls` characters from s[j]. */
static size_t run_end(const unsigned char *s, size_t len, size_t j, int cls) {
    while (j < len) {
        int c;
        int n = char_at(s, len, j, &c);
        if (c != cls) break;
        j += (size_t)n;
    }
    return j;
}

size_t loom_pretok_next(const unsigned char *s, size_t len, size_t i) {
    if (s[i] == '\'' && i + 1 < len) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < len && (((a == 'r' || a == 'v') && s[i + 2] == 'e') || (a == 'l' && s[i + 2] == 'l'))) return i + 3;
    }
    int cls;
    size_t j = i + (size_t)char_at(s, len, i, &cls);
    if (s[i] == ' ' && j < len) {
        int next;
        int n = char_at(s, len, j, &next);
        if (next != LOOM_CC_SPACE) {
            cls = next;
            j += (size_t)n;
        }
    }
    if (cls == LOOM_CC_SPACE) {
        /* \s+(?!\S) keeps the last space of a run for the next word;
         * a lone non-' ' space before a word matches \s+ by itself. */
        size_t last = i;
        while (j < len) {
            int c;
            int n = char_at(s, len, j, &c);
            if (c != LOOM_CC_SPACE) return last > i ? last : j;
            last = j;
            j += (size_t)n;
        }
        return len;
    }
    return run_end(s, len, j, cls);
}

static inline int crlf(unsigned char c) { return c == '\r' || c == '\n'; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d): the contraction's length at s[i], or 0.
 * Only ASCII folds (tokenizers' Oniguruma does not fold U+017F to 's'). */
static size_t contraction(const unsigned char *s, size_t len, size_t i) {
    if (s[i] != '\'' || i + 1 >= len) return 0;
    unsigned char a = s[i + 1] | 0x20, b = i + 2 < len ? s[i + 2] | 0x20 : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* The whitespace alternatives \s*[\r\n]+|\s+(?!\S)|\s+ at s[i] (a space). */
static size_t llama3_space(const unsigned char *s, size_t len, size_t i) {
    size_t j = i, last = i, brk = 0;
    while (j < len) {
        int c;
        int n = char_at(s, len, j, &c);
        if (c != LOOM_CC_SPACE) break;
        if (crlf(s[j])) brk = j + 1;
        last = j;
        j += (size_t)n;
    }
    if (brk) return brk; /* up to the run's last line break */
    if (j == len) return len;
    return last > i ? last : j;
}

/* Llama 3's regex (max_digits 3) or Qwen2's (1); see bpe_pretok.h. */
static size_t llama3_next(const unsigned char *s, size_t len, size_t i, int max_digits) {
    size_t k = contraction(s, len, i);
    if (k) return i + k;
    int c0;
    size_t j = i + (size_t)char_at(s, len, i, &c0);
    if (c0 == LOOM_CC_LETTER) return run_end(s, len, j, LOOM_CC_LETTER);
    if (c0 == LOOM_CC_NUMBER) {
        for (int d = 1; d < max_digits && j < len; d++) {
            int c;
            int n = char_at(s, len, j, &c);
            if (c != LOOM_CC_NUMBER) break;
            j += (size_t)n;
        }
        return j;
    }
    int c1 = -1, n1 = 0;
    if (j < len) n1 = char_at(s, len, j, &c1);
    if (!crlf(s[i]) && c1 == LOOM_CC_LETTER) return run_end(s, len, j + (size_t)n1, LOOM_CC_LETTER);
    if (c0 == LOOM_CC_OTHER || (s[i] == ' ' && c1 == LOOM_CC_OTHER)) {
        size_t e = run_end(s, len, c0 == LOOM_CC_OTHER ? j : j + (size_t)n1, LOOM_CC_OTHER);
        while (e < len && crlf(s[e])) e++;
        return e;
    }
    return llama3_space(s, len, i);
}

/* SmolLM2's Digits(individual_digits) then the GPT-2 regex: a digit is a
 * piece, and no GPT-2 piece runs into one. */
static size_t digits_next(const unsigned char *s, size_t len, size_t i) {
    int c;
    size_t j = i + (size_t)char_at(s, len, i, &c);
    if (c == LOOM_CC_NUMBER) return j;
    size_t e = i;
    while (e < len) { /* the digit-free stretch from i */
        int n = char_at(s, len, e, &c);
        if (c == LOOM_CC_NUMBER) break;
        e += (size_t)n;
    }
    return loom_pretok_next(s, e, i);
}

size_t loom_pretok_next_kind(loom_pretok_kind k, const unsigned char *s, size_t len, size_t i) {
    switch (k) {
    case LOOM_PRETOK_GPT2: return loom_pretok_next(s, len, i);
    case LOOM_PRETOK_LLAMA3: return llama3_next(s, len, i, 3);
    case LOOM_PRETOK_QWEN2: return llama3_next(s, len, i, 1);
    case LOOM_PRETOK_DIGITS: return digits_next(s, len, i);
    default: return len;
    }
}

/* Where a cut is safe for every kind: a space that is not a line break. */
static inline int cut_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }
/* ... after a letter or digit: not the end of an added token such as "</s>",
 * after which the next piece gets the prefix space of a piece start. */
static inline int ascii_alnum(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

size_t loom_pretok_safe_cut(const unsigned char *s, size_t len, size_t want) {
    if (want > len) want = len;
    if (want >= len) return len;
    for (size_t p = want; p > 0; p--)
        if (cut_space(s[p]) && ascii_alnum(s[p - 1])) return p;
    return 0;
}

size_t loom_pretok_safe_cut_after(const unsigned char *s, size_t len, size_t from) {
    for (size_t p = from > 0 ? from : 1; p < len; p++)
        if (cut_space(s[p]) && ascii_alnum(s[p - 1])) return p;
    return 0;
}

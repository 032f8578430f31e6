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
            bmp_class[c] = loom_unicode_ranges[k].cls;
}

/* The class of `cp` by binary search over the ranges. */
static int range_class(unsigned cp) {
    int lo = 0, hi = loom_unicode_nranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < loom_unicode_ranges[mid].lo) hi = mid - 1;
        else if (cp > loom_unicode_ranges[mid].hi) lo = mid + 1;
        else return loom_unicode_ranges[mid].cls;
    }
    return LOOM_CC_OTHER;
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
    return cp > 0x10FFFF ? LOOM_CC_OTHER : range_class(cp);
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
    while (j < len) {
        int c;
        int n = char_at(s, len, j, &c);
        if (c != cls) break;
        j += (size_t)n;
    }
    return j;
}

static inline int ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

size_t loom_pretok_safe_cut(const unsigned char *s, size_t len, size_t want) {
    if (want > len) want = len;
    if (want >= len) return len;
    for (size_t p = want; p > 0; p--)
        if (ascii_space(s[p]) && s[p - 1] < 0x80 && !ascii_space(s[p - 1])) return p;
    return 0;
}

size_t loom_pretok_safe_cut_after(const unsigned char *s, size_t len, size_t from) {
    for (size_t p = from > 0 ? from : 1; p < len; p++)
        if (ascii_space(s[p]) && s[p - 1] < 0x80 && !ascii_space(s[p - 1])) return p;
    return 0;
}

build-there/src/data/bpe_unicode.o: src/data/bpe_unicode.c \
 src/data/bpe_unicode.h
src/data/bpe_unicode.h:

build-there/src/data/bpe_pretok.o: src/data/bpe_pretok.c \
 src/data/bpe_pretok.h src/data/bpe_unicode.h
src/data/bpe_pretok.h:
src/data/bpe_unicode.h:

build-there/src/data/bpe_train.o: src/data/bpe_train.c \
 src/data/bpe_build.h src/data/tokenizer.h src/data/../core/core.h \
 src/data/bpe_map.h src/data/bpe_pretok.h
src/data/bpe_build.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/data/bpe_map.h:
src/data/bpe_pretok.h:

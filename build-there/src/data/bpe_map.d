build-there/src/data/bpe_map.o: src/data/bpe_map.c src/data/bpe_map.h \
 src/data/../core/core.h
src/data/bpe_map.h:
src/data/../core/core.h:

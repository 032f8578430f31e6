build-there/src/data/dataset.o: src/data/dataset.c src/data/dataset.h \
 src/core/core.h src/data/tokenizer.h src/data/../core/core.h \
 src/data/shard.h
src/data/dataset.h:
src/core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/data/shard.h:

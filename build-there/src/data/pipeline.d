build-there/src/data/pipeline.o: src/data/pipeline.c src/data/pipeline.h \
 src/data/tokenizer.h src/data/../core/core.h src/data/bpe_pretok.h \
 src/data/shard.h
src/data/pipeline.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/data/bpe_pretok.h:
src/data/shard.h:

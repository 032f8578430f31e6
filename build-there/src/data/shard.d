build-there/src/data/shard.o: src/data/shard.c src/data/shard.h \
 src/data/../core/core.h
src/data/shard.h:
src/data/../core/core.h:

build-there/src/serve/kv_cache.o: src/serve/kv_cache.c \
 src/serve/kv_cache.h src/core/core.h
src/serve/kv_cache.h:
src/core/core.h:

build-there/src/data/tokenizer.o: src/data/tokenizer.c \
 src/data/tokenizer.h src/data/../core/core.h \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h src/data/bpe_build.h \
 src/data/bpe_map.h src/data/bpe_pretok.h
src/data/tokenizer.h:
src/data/../core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:
src/data/bpe_build.h:
src/data/bpe_map.h:
src/data/bpe_pretok.h:

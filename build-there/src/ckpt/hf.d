build-there/src/ckpt/hf.o: src/ckpt/hf.c src/ckpt/hf.h \
 src/ckpt/tensormap.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/data/tokenizer.h src/data/../core/core.h \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h
src/ckpt/hf.h:
src/ckpt/tensormap.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:

build-there/src/ckpt/tensormap.o: src/ckpt/tensormap.c \
 src/ckpt/tensormap.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h
src/ckpt/tensormap.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:

build-there/src/model/gpt.o: src/model/gpt.c src/model/gpt.h \
 src/model/../backend/backend.h src/model/../backend/../core/core.h \
 src/model/../backend/ops.h src/model/../core/core.h src/core/mem.h
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/core/mem.h:

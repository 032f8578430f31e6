build-there/src/train/eval.o: src/train/eval.c src/train/eval.h \
 src/data/dataset.h src/core/core.h src/data/tokenizer.h \
 src/data/../core/core.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h
src/train/eval.h:
src/data/dataset.h:
src/core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:

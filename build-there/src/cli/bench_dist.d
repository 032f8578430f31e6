build-there/src/cli/bench_dist.o: src/cli/bench_dist.c \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/cli/args.h src/cli/commands.h src/parallel/dist.h \
 src/parallel/../core/core.h src/parallel/launch.h src/core/core.h \
 src/model/gpt.h src/model/../backend/backend.h src/model/../core/core.h \
 src/train/step.h
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/cli/args.h:
src/cli/commands.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/parallel/launch.h:
src/core/core.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
src/train/step.h:

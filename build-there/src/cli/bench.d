build-there/src/cli/bench.o: src/cli/bench.c src/backend/backend.h \
 src/backend/../core/core.h src/backend/ops.h src/backend/plugin.h \
 src/cli/args.h src/cli/commands.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../core/core.h src/train/step.h \
 src/parallel/dist.h src/parallel/../core/core.h src/train/step_graph.h
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/backend/plugin.h:
src/cli/args.h:
src/cli/commands.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
src/train/step.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/train/step_graph.h:

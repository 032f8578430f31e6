build-there/src/parallel/dist.o: src/parallel/dist.c src/parallel/dist.h \
 src/parallel/../core/core.h src/backend/plugin.h \
 src/parallel/dist_impl.h src/core/core.h
src/parallel/dist.h:
src/parallel/../core/core.h:
src/backend/plugin.h:
src/parallel/dist_impl.h:
src/core/core.h:

build-there/src/parallel/launch.o: src/parallel/launch.c \
 src/parallel/launch.h src/core/core.h src/parallel/dist.h \
 src/parallel/../core/core.h
src/parallel/launch.h:
src/core/core.h:
src/parallel/dist.h:
src/parallel/../core/core.h:

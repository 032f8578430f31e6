build-there/src/parallel/dist_tcp.o: src/parallel/dist_tcp.c \
 src/parallel/dist_impl.h src/core/core.h
src/parallel/dist_impl.h:
src/core/core.h:

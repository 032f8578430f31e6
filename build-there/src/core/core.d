build-there/src/core/core.o: src/core/core.c src/core/core.h
src/core/core.h:

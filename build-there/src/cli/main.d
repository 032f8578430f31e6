build-there/src/cli/main.o: src/cli/main.c src/cli/commands.h \
 src/core/core.h
src/cli/commands.h:
src/core/core.h:

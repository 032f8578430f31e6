build-there/src/cli/args.o: src/cli/args.c src/cli/args.h \
 src/cli/commands.h src/core/core.h
src/cli/args.h:
src/cli/commands.h:
src/core/core.h:

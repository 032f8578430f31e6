build-there/src/backend/plugin.o: src/backend/plugin.c \
 src/backend/plugin.h
src/backend/plugin.h:

#!/usr/bin/env bash
# House rule: no function over 80 lines unless a comment in the 6 lines
# before it says "longer than 80 lines because ...". Checked over every
# C, C++ and CUDA file in src/.
set -u
cd "$(dirname "$0")/.."
FILES=$(find src -name '*.c' -o -name '*.cu' -o -name '*.h' -o -name '*.cpp' | sort)
out=$(/usr/bin/python3 - $FILES <<'PY'
import re, sys
for f in sys.argv[1:]:
    lines = open(f, errors='replace').read().split('\n')
    i = 0
    while i < len(lines):
        l = lines[i]
        starts = (l and not l[0].isspace() and l[0] not in '#/*}' and '(' in l and not l.rstrip().endswith(';')
                  and not l.startswith(('typedef', 'struct', 'enum', 'union')) and '=' not in l.split('(')[0])
        if starts:
            j = i
            while j < len(lines) and '{' not in lines[j] and not lines[j].rstrip().endswith(';'):
                j += 1
            if j < len(lines) and '{' in lines[j]:
                k = j + 1
                while k < len(lines) and not lines[k].startswith('}'):
                    k += 1
                marked = 'longer than 80 lines because' in '\n'.join(lines[max(0, i - 6):i])
                if k - i + 1 > 80 and not marked:
                    m = re.search(r'[A-Za-z_]\w*(?=\s*\()', l)
                    print(f"{f}:{i + 1}: {m.group(0) if m else l[:40]} is {k - i + 1} lines")
                i = k + 1
                continue
        i += 1
PY
); rc=$?
if [ $rc -ne 0 ]; then echo "FAIL functions_under_80_lines: the checker failed ($rc): $out"
elif [ -z "$out" ]; then echo "PASS functions_under_80_lines ($(echo $FILES | wc -w) files)"
else echo "FAIL functions_under_80_lines: $(echo "$out" | head -5 | tr '\n' ';')"; fi

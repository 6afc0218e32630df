import sys, re, collections
def hist(p):
    c = collections.Counter()
    for line in open(p):
        m = re.search(r"^\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*?);", line)
        if m and re.match(r"(F[A-Z0-9]*|MUFU|HFMA2|HADD2|HMUL2|F2F|F2FP|I2F|F2I)", m.group(1)):
            ops = re.sub(r"\bU?R\d+\b(\.reuse)?|\bU?P\d\b|\bRZ\b|\bURZ\b", "R", m.group(2))
            c[m.group(1) + ops] += 1
    return c
a, b = hist(sys.argv[1]), hist(sys.argv[2])
print("float ops identical" if a == b else f"float ops differ: {dict((a-b))} vs {dict((b-a))}", sum(a.values()))

#!/usr/bin/env python3
"""Writes tests/data/reuters_tm.csv: the Reuters-21578 articles that
Debian's r-cran-tm ships (package tm, GPL-3; texts/acq: 50 articles on
acquisitions, texts/crude: 20 on crude oil) as 64 token ids per article
(the 999 most frequent words over all 70, id 0 is padding, 1 an unknown
word; longer articles are cut, shorter ones padded at the end) and the
label (0 acq, 1 crude). Rows in a fixed shuffled order, so the eval split
of the job (every 5th row) holds both classes. Standard library only.

Usage: reuters_tm.py [TEXTS_DIR] [OUT.csv]
"""
import collections
import html
import os
import random
import re
import sys

TEXTS = sys.argv[1] if len(sys.argv) > 1 else "/usr/lib/R/site-library/tm/texts"
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(__file__), "..", "..", "tests", "data", "reuters_tm.csv")
STEPS, VOCAB = 64, 1000


def words(path):
    with open(path, encoding="latin-1") as f:
        t = f.read()
    title = re.search(r"<TITLE>(.*?)</TITLE>", t, re.S)
    body = re.search(r"<BODY>(.*?)</BODY>", t, re.S)
    text = (title.group(1) if title else "") + " " + (body.group(1) if body else "")
    return re.findall(r"[a-z]+", html.unescape(text).lower())


docs = []
for label, topic in enumerate(["acq", "crude"]):
    d = os.path.join(TEXTS, topic)
    for name in sorted(os.listdir(d)):
        docs.append((words(os.path.join(d, name)), label))
random.Random(7).shuffle(docs)
count = collections.Counter(w for ws, _ in docs for w in ws)
ids = {w: i + 2 for i, (w, _) in enumerate(count.most_common(VOCAB - 2))}
with open(OUT, "w") as f:
    f.write(",".join(f"t{i}" for i in range(STEPS)) + ",label\n")
    for ws, label in docs:
        row = [ids.get(w, 1) for w in ws[:STEPS]]
        row += [0] * (STEPS - len(row))
        f.write(",".join(map(str, row)) + f",{label}\n")
print(f"{OUT}: {len(docs)} articles, {STEPS} ids each, vocabulary {VOCAB}")

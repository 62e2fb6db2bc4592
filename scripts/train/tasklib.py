"""Training-data side of the task contract (docs/tasks.md), in the Python standard library only.

- Tok512: the llama2.c tokenizer (data/tok512.bin) with run.c's encode() semantics: BOS = 1, a
  dummy-prefix " ", one piece per UTF-8 codepoint (or one byte-fallback id = byte + 3 per byte),
  then repeatedly merge the adjacent pair whose concatenation is the piece with the highest
  score, the leftmost on ties.
- Piecewise encoding: tok512 has no piece with a space after its first byte and none with a
  newline (the newline is byte fallback <0x0A>, which never merges), so no merge crosses a point
  right before a space or on either side of a newline. The text is cut there into segments, each
  segment is merged on its own (cached), and the concatenation is the encoding of the whole. The
  tokenizer checks this property of the vocabulary when it loads; python/tests compares the
  result with the engine's own tokenizer.
- render(task, question, parts): the prompt text of a sample from its parts (the fields the C++
  generator dumps with --dump-samples), per docs/tasks.md.
- TaskGenerator: seeded samples (prompt ids, completion ids) for niah_single, niah_multikey,
  niah_multivalue, niah_multiquery and vt, with haystacks noise, essay and needle.

Seeds: every sample's random.Random is seeded with a string "<namespace>:<seed>:<stream>:<index>"
(random.Random hashes str seeds with SHA-512). Training uses namespace "vq-train", the trainer's
held-out accuracy "vq-heldout"; the C++ evaluation uses integer seeds in its own generator, and
its essay text (WikiText) is one training never reads, so no evaluation prompt is a training one.
"""

import hashlib
import math
import random
import re
import struct

BOS = 1
EOS = 2
NEWLINE_ID = 13  # <0x0A>: byte fallback of "\n" (10 + 3)

# ---------------------------------------------------------------------------------------------
# Tokenizer


class Tok512:
    """run.c's tokenizer over a llama2.c tokenizer file (vocab_size pieces)."""

    def __init__(self, path, vocab_size=512):
        with open(path, "rb") as f:
            data = f.read()
        self.path = path
        if len(data) < 4:
            raise ValueError(f"{path}: truncated llama2.c tokenizer (no max_token_length)")
        at = 4
        self.pieces = []
        self.scores = []
        for i in range(vocab_size):
            if len(data) - at < 8:
                raise ValueError(f"{path}: truncated at piece {i} of {vocab_size}")
            score, n = struct.unpack_from("<fi", data, at)
            at += 8
            if n < 0 or len(data) - at < n:
                raise ValueError(f"{path}: piece {i} has bad length {n}")
            self.pieces.append(data[at:at + n])
            self.scores.append(score)
            at += n
        if at != len(data):
            raise ValueError(f"{path}: {len(data) - at} bytes after {vocab_size} pieces")
        self.lookup = {}
        for i in range(vocab_size - 1, -1, -1):  # the lowest id wins, as the engine
            self.lookup[self.pieces[i]] = i
        self.space_id = self.lookup[b" "]
        # The piecewise encoding is exact only if no piece (other than BOS/EOS, which encode()
        # never produces from text) has a space after its first byte or holds a newline.
        for i, p in enumerate(self.pieces):
            if i in (BOS, EOS):
                continue
            if b" " in p[1:] or b"\n" in p:
                raise ValueError(f"{path}: piece {i} {p!r} would make piecewise encoding inexact")
        if b"\n" in self.lookup:
            raise ValueError(f"{path}: a plain newline piece breaks the newline split")
        self._seg_cache = {}
        self._seg_re = re.compile(r"\n|[ ]?[^ \n]*")

    # -- exact encoding (run.c) --------------------------------------------------------------
    def _codepoints(self, b):
        out = []
        n = len(b)
        i = 0
        buf = bytearray()
        while i < n:
            c = b[i]
            if (c & 0xC0) != 0x80:
                buf = bytearray()
            buf.append(c)
            nxt = b[i + 1] if i + 1 < n else 0
            i += 1
            if (nxt & 0xC0) == 0x80 and len(buf) < 4:
                continue
            tid = self.lookup.get(bytes(buf))
            if tid is not None:
                out.append(tid)
            else:
                out.extend(x + 3 for x in buf)
            buf = bytearray()
        return out

    def merge_bytes(self, b):
        """run.c's merge loop over the codepoints of b (no BOS, no dummy prefix)."""
        toks = self._codepoints(b)
        pieces, scores, lookup = self.pieces, self.scores, self.lookup
        while True:
            best, best_i, best_id = -1e10, -1, -1
            for i in range(len(toks) - 1):
                tid = lookup.get(pieces[toks[i]] + pieces[toks[i + 1]])
                if tid is not None and scores[tid] > best:
                    best, best_i, best_id = scores[tid], i, tid
            if best_i < 0:
                return toks
            toks[best_i:best_i + 2] = [best_id]

    def encode_exact(self, text, bos=True):
        """The whole text merged at once (quadratic: for tests on short texts)."""
        ids = [BOS] if bos else []
        if text:
            ids += self.merge_bytes(b" " + text.encode("utf-8"))
        return ids

    # -- fast piecewise encoding ---------------------------------------------------------------
    def encode_body(self, text):
        """Ids of `text` as it appears inside a longer encoding (no BOS, no dummy prefix):
        valid where text starts at a segment boundary (a space, a newline, or after one)."""
        cache = self._seg_cache
        out = []
        for seg in self._seg_re.findall(text):
            if not seg:
                continue
            ids = cache.get(seg)
            if ids is None:
                if seg == "\n":
                    ids = [NEWLINE_ID]
                else:
                    ids = self.merge_bytes(seg.encode("utf-8"))
                if len(cache) > 500000:
                    cache.clear()
                cache[seg] = ids
            out.extend(ids)
        return out

    def encode(self, text, bos=True):
        """run.c's encode(text, bos, eos=0), piecewise."""
        ids = [BOS] if bos else []
        if text:
            ids += self.encode_body(" " + text)
        return ids

    def decode(self, ids):
        """Bytes -> str of the pieces (byte fallback as the raw byte), without specials."""
        out = bytearray()
        for t in ids:
            if t in (0, BOS, EOS):
                continue
            if 3 <= t < 259:
                out.append(t - 3)
            else:
                out += self.pieces[t]
        return out.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Templates (docs/tasks.md; RULER's)

NIAH_INSTRUCTION = ("Some special magic {type} are hidden within the following text. Make sure to "
                    "memorize it. I will quiz you about the {type} afterwards.\n")
NIAH_QUESTION = "What are all the special magic {type} for {query} mentioned in the provided text?"
NIAH_ANSWER_PREFIX = " The special magic {type} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic numbers for {key} is: {value}."
VT_INSTRUCTION = ("Memorize and track the chain(s) of variable assignment hidden in the following "
                  "text.\n\n")
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_ANSWER_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, "
                    "{num_v} variables are assigned the value {query}, they are: ")
NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
         "again.")
VT_NUM_V = 5

NIAH_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")
TASKS = NIAH_TASKS + ("vt",)
HAYSTACKS = ("noise", "essay", "needle")
QUESTIONS = ("last", "first")


def _singular(s):
    # RULER's rewrite for one queried key with one value, on the raw template.
    return s.replace("Some", "A").replace("are all", "is").replace("are", "is")


def join_query(keys):
    """RULER's join: 'k1', or 'k1, k2, and k3'."""
    keys = [str(k) for k in keys]
    if len(keys) == 1:
        return keys[0]
    return ", ".join(keys[:-1]) + ", and " + keys[-1]


def templates(task):
    """(instruction, question, answer_prefix) with {query} left open."""
    if task in NIAH_TASKS:
        instr, quest, prefix = NIAH_INSTRUCTION, NIAH_QUESTION, NIAH_ANSWER_PREFIX
        typ = "numbers"
        if task in ("niah_single", "niah_multikey"):
            instr, quest, prefix = _singular(instr), _singular(quest), _singular(prefix)
            typ = "number"
        f = lambda s: s.replace("{type}", typ)
        return f(instr), f(quest), f(prefix)
    if task == "vt":
        f = lambda s: s.replace("{num_v}", str(VT_NUM_V))
        return VT_INSTRUCTION, f(VT_QUESTION), f(VT_ANSWER_PREFIX)
    raise ValueError(f"unknown task '{task}' (expected one of {', '.join(TASKS)})")


def context_items(parts):
    """Haystack sentences with the inserts placed: insert [p, text] goes right before haystack
    sentence p (p = len(sentences): after the last); inserts at one position keep list order."""
    sentences = parts["sentences"]
    by_pos = {}
    for pos, text in parts["inserts"]:
        if not 0 <= pos <= len(sentences):
            raise ValueError(f"insert position {pos} outside [0, {len(sentences)}]")
        by_pos.setdefault(pos, []).append(text)
    items = []
    for i in range(len(sentences) + 1):
        items.extend(by_pos.get(i, ()))
        if i < len(sentences):
            items.append(sentences[i])
    return items


def separator(haystack):
    if haystack == "essay":
        return " "
    if haystack in ("noise", "needle"):
        return "\n"
    raise ValueError(f"unknown haystack '{haystack}' (expected one of {', '.join(HAYSTACKS)})")


def query_text(parts):
    q = parts["query"]
    if isinstance(q, (list, tuple)):
        return join_query(q)
    return str(q)


def frame(task, question, query):
    """(head, tail) around the context: prompt = head + context + tail."""
    instr, quest, prefix = templates(task)
    quest = quest.replace("{query}", query)
    prefix = prefix.replace("{query}", query)
    if question == "last":
        return instr, "\n" + quest + prefix
    if question == "first":
        return instr + quest + "\n", "\nAnswer:"
    raise ValueError(f"unknown question placement '{question}' (expected last or first)")


def render(task, question, parts):
    """The prompt text of a sample (docs/tasks.md), from its parts."""
    head, tail = frame(task, question, query_text(parts))
    return head + separator(parts["haystack"]).join(context_items(parts)) + tail


def completion_text(prompt, answers):
    body = ", ".join(str(a) for a in answers) + "."
    return body if prompt.endswith(" ") else " " + body


# ---------------------------------------------------------------------------------------------
# Texts


def split_sentences(text):
    """docs/tasks.md: split after '.', '!' or '?' followed by whitespace, and at line breaks;
    stripped; empty ones dropped."""
    out = []
    for line in text.split("\n"):
        for s in re.split(r"(?<=[.!?])\s+", line):
            s = s.strip()
            if s:
                out.append(s)
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_words(path):
    with open(path, encoding="utf-8") as f:
        words = [w.strip() for w in f if w.strip()]
    if len(words) < 8:
        raise ValueError(f"{path}: expected a word list (one a line), found {len(words)} words")
    return words


# ---------------------------------------------------------------------------------------------
# Generator


class TaskGenerator:
    """Seeded samples per docs/tasks.md, tokenized with piecewise caching.

    sample(...) returns a dict: task, question, haystack, length, prompt, answers, completion,
    parts, prompt_ids (BOS first, at most `length` ids), completion_ids (EOS last)."""

    def __init__(self, tok, words, essay_text):
        self.tok = tok
        self.words = list(words)
        self.essay = split_sentences(essay_text)
        if len(self.essay) < 16:
            raise ValueError(f"essay text has {len(self.essay)} sentences, expected at least 16")
        self._item_cache = {}

    def _ids(self, sep, item):
        key = (sep, item)
        ids = self._item_cache.get(key)
        if ids is None:
            ids = self.tok.encode_body(sep + item)
            if len(self._item_cache) > 400000:
                self._item_cache.clear()
            self._item_cache[key] = ids
        return ids

    def _key(self, rng, used):
        while True:
            a, b = rng.sample(self.words, 2)
            k = a + "-" + b
            if k not in used:
                used.add(k)
                return k

    @staticmethod
    def _value(rng, used):
        while True:
            v = rng.randint(1000000, 9999999)
            if v not in used:
                used.add(v)
                return v

    def sample(self, rng, task, question, haystack, length, depth=None):
        """length: the prompt's token budget (BOS included); depth in [0, 100] or None (random).
        Raises ValueError when the fixed parts alone exceed `length`."""
        if depth is None:
            depth = rng.uniform(0.0, 100.0)
        used_keys, used_values = set(), set()
        if task == "vt":
            if haystack != "noise":
                raise ValueError("vt uses the noise haystack")
            names = set()
            while len(names) < VT_NUM_V:
                names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
            names = sorted(names)
            rng.shuffle(names)
            value = rng.randint(10000, 99999)
            needles = ["VAR %s = %d" % (names[0], value)]
            needles += ["VAR %s = VAR %s " % (names[i + 1], names[i]) for i in range(VT_NUM_V - 1)]
            query, answers, keys, values = str(value), names, names, [value]
            depth_needle = None  # the chain goes to sorted random positions
        else:
            n_keys = 4 if task in ("niah_multikey", "niah_multiquery") else 1
            n_values = 4 if task == "niah_multivalue" else 1
            keys = [self._key(rng, used_keys) for _ in range(n_keys)]
            if task == "niah_multivalue":
                values = [self._value(rng, used_values) for _ in range(n_values)]
                needles = [NEEDLE.format(key=keys[0], value=v) for v in values]
                queried = [keys[0]]
            else:
                values = [self._value(rng, used_values) for _ in range(n_keys)]
                needles = [NEEDLE.format(key=k, value=v) for k, v in zip(keys, values)]
                queried = list(keys) if task == "niah_multiquery" else [keys[0]]
            query = join_query(queried)
            depth_needle = 0  # needles[0] is the queried one (the first queried for multiquery)
        head, tail = frame(task, question, query)
        sep = separator(haystack)
        head_ids = self.tok.encode(head)  # BOS + dummy prefix + head (ends with "\n")
        tail_ids = self.tok.encode_body(tail)
        needle_ids = [self._ids(sep, s) for s in needles]
        fixed = len(head_ids) + len(tail_ids) + sum(len(x) for x in needle_ids)
        if fixed + 1 > length:
            raise ValueError(f"{task}: length {length} leaves no room for the haystack")
        # Haystack sentences, counted with their separator, until the budget is spent.
        budget = length - fixed
        sentences = []
        used = 0
        if haystack == "essay":
            start = rng.randrange(len(self.essay))
            i = start
            while True:
                s = self.essay[i]
                c = len(self._ids(sep, s))
                if used + c > budget:
                    break
                sentences.append(s)
                used += c
                i = (i + 1) % len(self.essay)
        elif haystack == "noise":
            c = len(self._ids(sep, NOISE))
            sentences = [NOISE] * (budget // c)
        elif haystack == "needle":
            while True:
                s = NEEDLE.format(key=self._key(rng, used_keys),
                                  value=self._value(rng, used_values))
                c = len(self._ids(sep, s))
                if used + c > budget:
                    break
                sentences.append(s)
                used += c
        else:
            raise ValueError(f"unknown haystack '{haystack}'")
        while True:
            n = len(sentences)
            inserts = []
            if depth_needle is not None:
                inserts.append([int(math.floor(depth / 100.0 * n + 0.5)), needles[0]])
                rest = needles[1:]
                positions = [rng.randint(0, n) for _ in rest]
            else:
                rest = needles
                positions = sorted(rng.randint(0, n) for _ in rest)
            inserts += [[p, s] for p, s in zip(positions, rest)]
            parts = {"haystack": haystack, "sentences": sentences, "inserts": inserts,
                     "query": query, "keys": keys, "values": values}
            items = context_items(parts)
            ids = list(head_ids)
            for k, item in enumerate(items):
                # The first item follows the instruction's newline: no separator before it.
                ids.extend(self._ids("" if k == 0 else sep, item))
            ids.extend(tail_ids)
            if len(ids) <= length or not sentences:
                break
            sentences = sentences[:-1]  # the first item's missing separator cost a token more
        if len(ids) > length:
            raise ValueError(f"{task}: length {length} too short")
        if task == "niah_multivalue":
            # Values in the order they appear in the text (the order to read them out).
            order = {text: i for i, text in enumerate(items)}
            answers = [v for _, v in sorted(zip((order[s] for s in needles), values))]
        elif task != "vt":
            answers = values if task == "niah_multiquery" else [values[0]]
        prompt = head + sep.join(items) + tail
        completion = completion_text(prompt, answers)
        completion_ids = self.tok.encode_body(completion) + [EOS]
        return {"task": task, "question": question, "haystack": haystack, "length": length,
                "depth": depth, "prompt": prompt, "answers": [str(a) for a in answers],
                "completion": completion, "parts": parts, "prompt_ids": ids,
                "completion_ids": completion_ids}

    def lm_ids(self, rng, text_ids, n):
        """n ids of plain text: BOS, then a run of the text's ids from a random start."""
        start = rng.randrange(0, len(text_ids) - n)
        return [BOS] + text_ids[start:start + n - 1]


def sample_rng(namespace, seed, stream, index):
    return random.Random(f"{namespace}:{seed}:{stream}:{index}")


def string_match_all(generated, answers):
    """RULER's string_match_all: the fraction of answers found in the text (case-insensitive)."""
    g = generated.lower()
    return sum(1.0 for a in answers if str(a).lower() in g) / len(answers)

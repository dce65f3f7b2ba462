"""Training text for the tiny tokenizers: English prose, contractions, digits, code and a little
non-Latin text, so that merges, the split pattern and byte fallback all have work to do."""

CORPUS = """\
Petals runs large language models collaboratively. A model is cut into transformer blocks,
volunteer servers each serve a range of blocks, and they announce themselves in a distributed hash table.
A client walks a route of servers that together cover all blocks. The monitor shows which models are
fully served, why one is slow or broken, and lets you chat with a model through the healthiest servers.
It's a swarm: you'll see servers join and leave, they're volunteers, we've measured 1234 tokens in 56.7 s.
Hello, world! How are you today? I'm fine, thanks. What's the weather like in Paris in 2024?
def route(blocks: list[int]) -> dict:\n    return {"start": 0, "end": len(blocks)}  # a comment
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the quick brown fox?
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 10000 3.14159 2,718 1e-5 -42 +7 50%.
Punctuation -- dashes, "quotes", 'single quotes', (parens), [brackets], {braces}, <angles>; colons: and more...
Bonjour à tous, ça va très bien. Grüße aus München. ¿Dónde está la biblioteca? Æsir, Øresund, Ångström.
Привет, мир. Как дела? Γεια σου κόσμε. こんにちは世界。你好，世界。안녕하세요.
Tabs\tand  double  spaces,   triple spaces, trailing spaces   \nnew lines\n\nand blank lines.
Emoji are bytes too: 🙂 🚀 ✨ — and so are rare symbols: ∑ ∫ √ ≈ ≠ ≤ ≥ ∞ → ←.
Servers announce block ranges, throughput, cache tokens left and their next pings every few seconds.
The generation check asks a fixed prompt and compares the answer with the one computed locally.
Llama, Mixtral, Falcon and BLOOM are model families; experts are routed per token, two of eight.
"""

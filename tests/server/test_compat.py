"""tandem serve's compatible endpoints, driven by real clients over 127.0.0.1: the official
`openai` Python library (completions and chat, plain and streamed) and curl (llama.cpp's
/completion, SGLang's /generate, /tokenize, /detokenize).

Usage: test_compat.py TANDEM_BINARY MODEL.gguf   (run by ctest through the tests' venv)
"""
import json
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.request

import openai

TANDEM, MODEL = sys.argv[1], sys.argv[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [TANDEM, "serve", "-m", MODEL, "--port", str(self.port), "-t", "1", *extra],
            stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def curl(*args):
    out = subprocess.run(["curl", "-sS", "--max-time", "60", *args], check=True,
                         capture_output=True, text=True)
    return out.stdout


class Compat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused",
                                   max_retries=0, timeout=60)
        cls.ids = json.loads(curl("-d", json.dumps({"content": "The capital of France is"}),
                                  cls.server.url + "/tokenize"))["tokens"]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual(len(models.data), 1)
        self.assertTrue(models.data[0].id)

    def test_completion_plain_and_stream_agree(self):
        r = self.client.completions.create(model="m", prompt="The capital of France is",
                                           max_tokens=12, temperature=0, logprobs=2)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertEqual(len(choice.logprobs.tokens), 12)
        self.assertEqual("".join(choice.logprobs.tokens), choice.text)
        for tok, lp, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                choice.logprobs.top_logprobs):
            self.assertLessEqual(lp, 0)
            self.assertEqual(len(top), 2)
            # Greedy: the chosen token is the most likely one, with the same log-probability.
            self.assertEqual(max(top, key=top.get), tok)
            self.assertAlmostEqual(top[tok], lp, places=5)
        pieces = []
        finish = None
        for chunk in self.client.completions.create(model="m", prompt="The capital of France is",
                                                    max_tokens=12, temperature=0, stream=True):
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual("".join(pieces), choice.text)
        self.assertEqual(finish, "length")

    def test_token_id_prompt_equals_text_prompt(self):
        a = self.client.completions.create(model="m", prompt=self.ids, max_tokens=8, temperature=0)
        b = self.client.completions.create(model="m", prompt="The capital of France is",
                                           max_tokens=8, temperature=0)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertGreater(a.usage.prompt_tokens_details.cached_tokens, 0,
                           "the second identical prompt reuses the cached prefix")

    def test_tokens_as_token_ids(self):
        r = self.client.completions.create(model="m", prompt=self.ids, max_tokens=5, temperature=0,
                                           logprobs=1,
                                           extra_body={"return_tokens_as_token_ids": True})
        ids = [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens]
        llama = json.loads(curl("-d", json.dumps({"prompt": self.ids, "n_predict": 5,
                                                  "temperature": 0, "return_tokens": True}),
                                self.server.url + "/completion"))
        self.assertEqual(ids, llama["tokens"])

    def test_ignore_eos_generates_through_the_end_of_text(self):
        # A greedy prompt that ends early on the end-of-generation token (searched, so that the
        # test does not depend on the test model's weights).
        ended = None
        for k in range(2, 200):
            prompt = [self.ids[0], k, (7 * k) % 200 + 3]
            r = self.client.completions.create(model="m", prompt=prompt, max_tokens=64,
                                               temperature=0)
            if r.choices[0].finish_reason == "stop":
                ended = (prompt, r.usage.completion_tokens)
                break
        self.assertIsNotNone(ended, "no greedy continuation met the end of text")
        prompt, n = ended
        r = self.client.completions.create(model="m", prompt=prompt, max_tokens=64, temperature=0,
                                           logprobs=0,
                                           extra_body={"ignore_eos": True,
                                                       "return_tokens_as_token_ids": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 64)
        self.assertGreater(64, n)
        llama = json.loads(curl("-d", json.dumps({"prompt": prompt, "n_predict": 64,
                                                  "temperature": 0, "ignore_eos": True,
                                                  "return_tokens": True}),
                                self.server.url + "/completion"))
        self.assertEqual([int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens],
                         llama["tokens"])

    def test_stop_and_echo(self):
        full = self.client.completions.create(model="m", prompt="The capital of France is",
                                              max_tokens=12, temperature=0).choices[0].text
        word = full.split()[2]
        r = self.client.completions.create(model="m", prompt="The capital of France is",
                                           max_tokens=12, temperature=0, stop=[word])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].text, full[:full.index(word)])
        streamed = "".join(c.choices[0].text for c in self.client.completions.create(
            model="m", prompt="The capital of France is", max_tokens=12, temperature=0,
            stop=[word], stream=True))
        self.assertEqual(streamed, r.choices[0].text)
        e = self.client.completions.create(model="m", prompt="The capital of France is",
                                           max_tokens=4, temperature=0, echo=True)
        self.assertTrue(e.choices[0].text.startswith("The capital of France is"))

    def test_chat_plain_and_stream(self):
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = self.client.chat.completions.create(model="m", messages=msgs, max_tokens=10,
                                                temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        text = r.choices[0].message.content
        self.assertIsInstance(text, str)
        streamed = []
        for chunk in self.client.chat.completions.create(model="m", messages=msgs, max_tokens=10,
                                                         temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                streamed.append(chunk.choices[0].delta.content)
        self.assertEqual("".join(streamed), text)

    def test_bad_request_is_a_400_the_client_understands(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model="m", prompt=[1, 2, 10**9], max_tokens=2)
        self.assertIn("prompt[2]", str(cm.exception))

    def test_curl_llamacpp_completion_with_token_array(self):
        r = json.loads(curl("-d", json.dumps({"prompt": self.ids, "n_predict": 6,
                                              "temperature": 0, "n_probs": 3,
                                              "return_tokens": True}),
                            self.server.url + "/completion"))
        self.assertEqual(r["tokens_predicted"], 6)
        self.assertEqual(len(r["tokens"]), 6)
        self.assertEqual(len(r["completion_probabilities"]), 6)
        first = r["completion_probabilities"][0]
        self.assertEqual(first["id"], r["tokens"][0])
        self.assertEqual(first["top_logprobs"][0]["id"], r["tokens"][0])
        stream = curl("-N", "-d", json.dumps({"prompt": self.ids, "n_predict": 6,
                                              "temperature": 0, "stream": True}),
                      self.server.url + "/completion")
        events = [json.loads(l[6:]) for l in stream.splitlines() if l.startswith("data: ")]
        self.assertTrue(events[-1]["stop"])
        self.assertEqual("".join(e["content"] for e in events), r["content"])

    def test_curl_sglang_generate_with_input_ids(self):
        r = json.loads(curl("-d", json.dumps({"input_ids": self.ids,
                                              "sampling_params": {"max_new_tokens": 5,
                                                                  "temperature": 0},
                                              "return_logprob": True, "logprob_start_len": 0,
                                              "top_logprobs_num": 1}),
                            self.server.url + "/generate"))
        self.assertEqual(len(r["output_ids"]), 5)
        meta = r["meta_info"]
        self.assertEqual(len(meta["input_token_logprobs"]), len(self.ids))
        self.assertIsNone(meta["input_token_logprobs"][0][0])
        self.assertEqual(meta["output_top_logprobs"][0][0][1], r["output_ids"][0])
        self.assertEqual(meta["finish_reason"]["type"], "length")

    def test_curl_tokenize_detokenize(self):
        text = "Paris is lovely."
        ids = json.loads(curl("-d", json.dumps({"content": text, "add_special": False}),
                              self.server.url + "/tokenize"))["tokens"]
        back = json.loads(curl("-d", json.dumps({"tokens": ids}),
                               self.server.url + "/detokenize"))["content"]
        self.assertEqual(back, text)
        metrics = curl(self.server.url + "/metrics")
        self.assertIn('tandem_requests_total{route="/tokenize",status="200"}', metrics)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])

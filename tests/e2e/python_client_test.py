"""tandem_client against a real local cluster (run by python_client_test.sh).

The environment names the cluster: TANDEM_TEST_ROUTER (a router started
with --api_key TANDEM_TEST_API_KEY), TANDEM_TEST_TLS_ROUTER (a router over
the same workers serving TLS with the certificate TANDEM_TEST_TLS_CA) and
TANDEM_TEST_GREEDY_TEXT (stories260K's greedy text from BOS, 256 tokens).
No test waits for time to pass: each reads the stream it started, and the
deadlines are wide except where a short one is the point.
"""

from __future__ import annotations

import os
import unittest

import grpc

import tandem_client as tc

# Wide, for a loaded 2-core machine: only a router that hangs hits it.
TIMEOUT = 120.0
# The model's context is 512 tokens: a generation from BOS that runs to its
# end is 511 tokens, one chunk each.
CONTEXT = 512


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run this through python_client_test.sh")
    return value


class ClusterTest(unittest.TestCase):
    client: tc.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = tc.Client(env("TANDEM_TEST_ROUTER"), api_key=env("TANDEM_TEST_API_KEY"))
        # Connected once, so that the short deadlines below measure a call,
        # not the channel's connection.
        assert cls.client.health(timeout=TIMEOUT, wait_for_ready=True) == tc.HealthStatus.SERVING

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()

    def test_health_reports_serving(self) -> None:
        self.assertEqual(self.client.health(timeout=TIMEOUT), tc.HealthStatus.SERVING)
        self.assertEqual(self.client.health("", timeout=TIMEOUT), tc.HealthStatus.SERVING)
        # Health needs no key.
        with tc.Client(env("TANDEM_TEST_ROUTER")) as keyless:
            self.assertEqual(keyless.health(timeout=TIMEOUT), tc.HealthStatus.SERVING)
        with self.assertRaises(tc.NotFound) as caught:
            self.client.health("no.such.Service", timeout=TIMEOUT)
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_streams_token_by_token(self) -> None:
        chunks = list(self.client.generate("Once upon a time", max_tokens=24, ignore_eos=True,
                                           timeout=TIMEOUT))
        *body, last = chunks
        self.assertGreaterEqual(len(body), 2)
        for chunk in body:
            self.assertIsInstance(chunk, tc.Chunk)
            self.assertEqual(chunk.index, 0)
            self.assertIsNone(chunk.finished)
            self.assertGreaterEqual(len(chunk.token_ids), 1)
        self.assertIsNotNone(last.finished)
        assert last.finished is not None
        tokens = [t for c in chunks for t in c.token_ids]
        text = "".join(c.text for c in chunks)
        self.assertEqual(len(tokens), 24)
        self.assertTrue(text.strip(), f"no text in {chunks}")
        self.assertEqual(last.finished.reason, tc.FinishReason.LENGTH)
        self.assertEqual(last.finished.usage.completion_tokens, 24)
        self.assertGreater(last.finished.usage.prompt_tokens, 0)
        self.assertGreater(last.finished.timeline.first_token_us, 0)
        self.assertGreaterEqual(last.finished.timeline.end_us,
                                last.finished.timeline.first_token_us)
        self.assertTrue(last.finished.decode_worker)

    def test_greedy_text_is_the_reference(self) -> None:
        with open(env("TANDEM_TEST_GREEDY_TEXT"), encoding="utf-8") as f:
            expected = f.read()
        [done] = self.client.generate(token_ids=[1], max_tokens=256, timeout=TIMEOUT).collect()
        self.assertEqual(done.text, expected)
        assert done.finished is not None
        self.assertEqual(len(done.token_ids), done.finished.usage.completion_tokens)

    def test_max_tokens_is_exact(self) -> None:
        for max_tokens in (1, 7, 33):
            [done] = self.client.generate("The cat sat on the mat and", max_tokens=max_tokens,
                                          ignore_eos=True, timeout=TIMEOUT).collect()
            assert done.finished is not None
            self.assertEqual(len(done.token_ids), max_tokens)
            self.assertEqual(done.finished.reason, tc.FinishReason.LENGTH)
            self.assertEqual(done.finished.usage.completion_tokens, max_tokens)

    def test_short_deadlines_raise_deadline_exceeded(self) -> None:
        # 511 tokens cannot come within 1 ms: the client's deadline...
        with self.assertRaises(tc.DeadlineExceeded) as caught:
            list(self.client.generate(token_ids=[1], ignore_eos=True, timeout=0.001))
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        # ...and the router's own limit (timeout_ms), which says so.
        with self.assertRaises(tc.DeadlineExceeded) as caught:
            list(self.client.generate(token_ids=[1], ignore_eos=True, server_timeout=0.001,
                                      timeout=TIMEOUT))
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn("deadline", caught.exception.message)

    def test_cancel_mid_stream(self) -> None:
        stream = self.client.generate(token_ids=[1], ignore_eos=True, timeout=TIMEOUT)
        read = [next(stream) for _ in range(3)]
        self.assertTrue(all(c.finished is None for c in read))
        # The call cannot have ended: its status follows 508 unread chunks.
        self.assertTrue(stream.cancel())
        self.assertTrue(stream.cancelled)
        self.assertEqual(list(stream), [])
        self.assertFalse(stream.cancel())
        # Leaving a with block cancels too (ten times, one chunk read each).
        for _ in range(10):
            with self.client.generate(token_ids=[1], ignore_eos=True, timeout=TIMEOUT) as other:
                self.assertGreaterEqual(len(next(other).token_ids), 1)
            self.assertTrue(other.cancelled)
            self.assertEqual(list(other), [])
        # The cluster serves on: a whole generation after the cancels.
        [done] = self.client.generate(token_ids=[1], max_tokens=CONTEXT - 1, ignore_eos=True,
                                      timeout=TIMEOUT).collect()
        self.assertEqual(len(done.token_ids), CONTEXT - 1)
        self.assertEqual(self.client.health(timeout=TIMEOUT), tc.HealthStatus.SERVING)

    def test_bad_arguments_are_invalid_argument(self) -> None:
        for kwargs, word in (({"max_tokens": -1}, "max_tokens"),
                             ({"max_tokens": 100000}, "context"),
                             ({"temperature": -1.0}, "temperature"),
                             ({"top_p": 0.0}, "top_p")):
            with self.subTest(**kwargs), self.assertRaises(tc.InvalidArgument) as caught:
                list(self.client.generate("Hi", timeout=TIMEOUT, **kwargs))
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(word, caught.exception.message)
        with self.assertRaises(tc.InvalidArgument) as caught:
            list(self.client.generate(token_ids=[1, 100000], timeout=TIMEOUT))
        self.assertIn("100000", caught.exception.message)
        with self.assertRaises(tc.NotFound):
            list(self.client.generate("Hi", model="no-such-model", timeout=TIMEOUT))

    def test_api_key_is_required(self) -> None:
        for key in (None, "not-the-key"):
            with tc.Client(env("TANDEM_TEST_ROUTER"), api_key=key) as other:
                with self.assertRaises(tc.Unauthenticated) as caught:
                    list(other.generate("Hi", max_tokens=2, timeout=TIMEOUT))
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_tls(self) -> None:
        with open(env("TANDEM_TEST_TLS_CA"), "rb") as f:
            ca = f.read()
        with tc.Client(env("TANDEM_TEST_TLS_ROUTER"), root_certificates=ca) as secure:
            self.assertEqual(secure.health(timeout=TIMEOUT, wait_for_ready=True),
                             tc.HealthStatus.SERVING)
            [over_tls] = secure.generate("Once upon a time", max_tokens=16,
                                         timeout=TIMEOUT).collect()
        [plain] = self.client.generate("Once upon a time", max_tokens=16,
                                       timeout=TIMEOUT).collect()
        self.assertEqual(over_tls.text, plain.text)
        # Plain gRPC to a TLS listener fails to connect.
        with tc.Client(env("TANDEM_TEST_TLS_ROUTER")) as plain_client:
            with self.assertRaises(tc.Unavailable):
                plain_client.health(timeout=TIMEOUT)

    def test_chat_choices_and_logprobs(self) -> None:
        [chat] = self.client.generate(messages=[tc.ChatMessage("user", "Tell me a story")],
                                      max_tokens=8, ignore_eos=True, timeout=TIMEOUT).collect()
        self.assertEqual(len(chat.token_ids), 8)
        choices = self.client.generate("Once", max_tokens=6, ignore_eos=True, n=2,
                                       temperature=1.0, seed=7, logprobs=2,
                                       timeout=TIMEOUT).collect()
        self.assertEqual([c.index for c in choices], [0, 1])
        for c in choices:
            self.assertEqual(len(c.token_ids), 6)
            self.assertEqual([l.token_id for l in c.logprobs], c.token_ids)
            self.assertTrue(all(len(l.top) == 2 for l in c.logprobs))
        # The same seed gives the same tokens.
        again = self.client.generate("Once", max_tokens=6, ignore_eos=True, n=2, temperature=1.0,
                                     seed=7, timeout=TIMEOUT).collect()
        self.assertEqual([c.token_ids for c in again], [c.token_ids for c in choices])
        [stopped] = self.client.generate(token_ids=[1], stop=" named", max_tokens=256,
                                         timeout=TIMEOUT).collect()
        assert stopped.finished is not None
        self.assertEqual(stopped.finished.reason, tc.FinishReason.STOP)
        self.assertNotIn(" named", stopped.text)


class RefusalTest(unittest.TestCase):
    """What the API cannot carry is refused before any call (no server needed)."""

    def test_refusals(self) -> None:
        # Nothing listens there: a call would fail with Unavailable, not ValueError.
        client = tc.Client("127.0.0.1:1")
        keyed = tc.Client("127.0.0.1:1", api_key="k")
        gen = client.generate
        for call in (
            lambda: gen(),
            lambda: gen("Hi", token_ids=[1]),
            lambda: gen(token_ids="abc"),
            lambda: gen(token_ids=[1, True]),
            lambda: gen("Hi", max_tokens=True),
            lambda: gen("Hi", max_tokens=2**31),
            lambda: gen("Hi", max_tokens=1.5),
            lambda: gen("Hi", temperature=float("nan")),
            lambda: gen("Hi", timeout=0),
            lambda: gen("Hi", timeout=-1.0),
            lambda: gen("Hi", server_timeout=0),
            lambda: gen("Hi", tools=[tc.Tool("f")]),
            lambda: gen("Hi", tool_choice="required"),
            lambda: gen(messages=[tc.ChatMessage("user", "Hi")], tool_choice="sometimes"),
            lambda: gen(messages=[{"role": "user", "content": "Hi"}]),
            lambda: gen("Hi", constraint=tc.Constraint()),
            lambda: gen("Hi", constraint=tc.Constraint(json_object=True, regex="a+")),
            lambda: gen("Hi", stop=[1]),
            lambda: gen("Hi", logit_bias=[(1, 2.0)]),
            lambda: gen("Hi", seed=-1),
            lambda: keyed.generate("Hi", metadata=[("authorization", "Bearer x")]),
            lambda: tc.Client("127.0.0.1:1", api_key=""),
            lambda: tc.Client("127.0.0.1:1", tls=True,
                              credentials=grpc.ssl_channel_credentials()),
            lambda: tc.Client("127.0.0.1:1", private_key=b"k"),
            lambda: tc.Client("127.0.0.1:1", root_certificates="not bytes"),
        ):
            with self.assertRaises(ValueError):
                call()
        with self.assertRaises(TypeError):
            gen("Hi", max_new_tokens=4)  # type: ignore[call-arg]
        with self.assertRaises(tc.Unavailable):
            client.health(timeout=TIMEOUT)
        client.close()
        keyed.close()


if __name__ == "__main__":
    unittest.main()

"""The sim-engine: a simulated vLLM (or SGLang) replica for tests, benchmarks and `llmgw up`.

Layout:

    main.py, config.py, app.py   the program: flags, validated settings, the HTTP app
    conn.py                      what every handler shares: content types, a gone client,
                                 a header's value as text JSON can carry
    auth.py, debug.py            the engine key on every route but /health, /metrics,
                                 /version; loopback-only debug routes
    errors.py                    the error every handler refuses with, in vLLM's body
    api.py                       chat, completions and embeddings: validation and bodies
    sampling.py, stops.py        sampling parameters (n, stop; vLLM's bounds on every
                                 API); where stop strings end a reply
    structured.py                tool_choice and response_format: JSON replies
    encoder.py                   the chat and completions answers, whole and streamed
    logprobs.py                  the `logprobs` of generated tokens, in vLLM's shapes
    batch.py, modelcards.py      a request of several choices (a batch, n > 1); /v1/models
    responses.py, messages.py    OpenAI's Responses and Anthropic's Messages, as vLLM serves
    pooling.py, audio.py         tokenize, detokenize, rerank, score; the audio routes
    routes.py                    the routes beyond chat, completions and embeddings
    lora.py                      LoRA adapters, as vLLM serves them
    sleep.py, sleepapi.py        sleep mode's state and wake times; its dev-mode routes
    engine.py, batcher.py        the engine loop in simulated time; continuous batching
    waiting.py                   the waiting queue of each --scheduling-policy
    kvcache.py, kvevents.py      the paged prefix cache; its KV-event publisher
    timing.py                    how long a step takes (the default engine shape)
    tokenizer.py                 the tokenizer (lives in llmgw.tokenization.sim)
    stats.py, metrics.py,        what the engine counts, rendered in the impersonated
    metricsnames.py              engine's metric names
    faults.py                    injected faults for the router's reliability tests
    requestlog.py                --request-log: each request's engine times, for benchmarks
"""

"""Data-quality checks: name what is wrong with a measurement instead of letting it become a verdict.

Pure functions (no I/O) over the `vllm bench serve` results (the JSON written with ``--save-result
--save-detailed``, read as `suite.stages.serve.read.ServeResult`), the server start records (`ServerStart`) and
server log texts. Every check returns
`Finding`s; ``severity == "unreliable"`` marks the cell (arm, point) unreliable for the metrics the finding
names (`Finding.metrics`, empty = every metric), ``"warning"`` is shown in the Data quality box only.

Checks and thresholds (each function's docstring says why):

=================== ======================================================================= ===========
check               fires when                                                              severity
=================== ======================================================================= ===========
failed-requests     ``failed > 0``, an error string, or ``completed`` < the prompts asked   unreliable
other-host          a repeat ran on another machine (host name, machine id, GPU UUIDs) than   unreliable
                    the baseline's repeat of its round and point: not paired
coalesced-stream    median ITL < 0.05 ms; or ≥ 10 % of requests got every token after the   unreliable
                    first in one burst (< 0.05 ms per token); or median ITL < 10 % of the
                    mean decode time per token (bursts with gaps); fewer burst requests     warning
chunked-stream      ≥ 10 % of requests got their tokens after the first in fewer than half  unreliable
                    as many chunks (ITL then times chunks; TTFT, TPOT, E2E stay right)      (ITL only)
low-concurrency     mean in-flight requests (Σ latencies / duration) < 70 % of              unreliable
                    min(concurrency, prompts), closed-loop runs only
client-bound        the benchmark client used ≥ 90 % of a core over the measurement         unreliable
warmup-outlier      the first measurement of a shape in a session has mean TTFT > 3× or     unreliable
                    output throughput < 1/3 of the median of the other repeats (≥ 2)
slow-request        a request's TTFT ≥ 4× its repeat's median TTFT (≥ 8 requests): the      warning
                    repeat's mean / P99 TTFT, E2E latency and throughput carry it
server-health       restarts; time to healthy > 3× the median of the other sessions (≥ 2);  warning
                    ERROR / Traceback lines in the server log
drift               exact Mann–Kendall trend of an arm's level of output throughput (the      warning
                    geometric mean of its points) against round, p < 0.05 / arms; ≥ 5 rounds
bimodal-sessions    an arm's per-session throughput levels split in two clusters (≥ 2       warning
                    each): best split R² ≥ max(0.8, its 95th percentile under one normal
                    cluster) and cluster levels ≥ 5 % apart
session-drift       a session's first point measured again at its end differs by > 2 % and  warning
                    > 5× the run's median difference (≥ 4 pairs)
round-outlier       a round's mean TPOT at a point differs from the median of the arm's     warning
                    other rounds there (≥ 3) by > 3 %, > 5× the run's median deviation and
                    > 3× the farthest of those other rounds from their median
block-outlier       together: all, ≥ 3 blocks a round: a block's mean TPOT against the other  warning
                    blocks of its round (same arm, point, server), by round-outlier's
                    rule with two others enough and 10× the run's median deviation
fast-path-not-taken an arm's server log: a kernel the gate is routed to ran untuned or was   warning
                    switched off (AITER tuned-config misses: a stock arm's only for the
                    model's gate shapes; vLLM's own messages)
hosts               an arm's repeats ran on more than one machine (a resume elsewhere, a      warning
                    requeued Slurm job): each machine with its rounds
software            an arm's software differs from the baseline's beyond the files its patch  warning
                    sets write: a version (vLLM, torch and its CUDA / HIP, Triton,
                    FlashInfer, AITER, Python), a vLLM file, a native extension; or it could
                    not be compared (a probe failed)
=================== ======================================================================= ===========

By subject: `suite.quality.finding` (the finding, the repeat, their order and wording), the serve stage's own
checks in `suite.stages.serve.checks` (per repeat; warm-up outliers), `suite.quality.server_log` (server
health), `suite.quality.series` (drift, session drift, bimodal sessions), `suite.quality.fast_path` (vendor log
patterns), `suite.quality.hosts` (the machines the repeats ran on), `suite.quality.software` (the arms'
software against the baseline's, from the manifest). `suite.quality.run.run_checks` runs them all over a list of `RepeatResult`; `summarize_findings`
gives the unreliable reasons per cell; `order_findings` / `finding_line` order and word them for the report's
Data quality box.
"""

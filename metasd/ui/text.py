"""The page's long texts: how to read the views, the playground's explanation (LaTeX), the tabs'
introductions and captions, and the keyboard script in the page's HEAD."""

HERO = ('<div id="hero"><h1>MetaSD Studio <span class="pill">{pill}</span></h1><p>Multi-drafter speculative decoding: '
        "a bandit picks which drafter proposes the next tokens; the target keeps only what it would write itself. "
        "Each token wears its drafter's colour.</p></div>")

HOW_TO_READ = """
- **Coloured, underlined token**: a drafter proposed it and the target accepted it. Each drafter has its own
  colour *and* underline style (legend above the tokens); hover a token for the drafter, p, q and min(1, p/q).
- **Plain token** (no colour): the target's own token. Every round ends with one: the correction after the first
  rejected draft token, or the **bonus token** when every drafted token was accepted.
- **\u2715n mark** between tokens: that round's drafter proposed n more tokens that the target did not keep (the
  first rejected, the rest discarded after it); hover the mark for them. *Rejected drafts: inline* shows them
  struck through in place instead, *hidden* leaves them out. They are never part of the answer.
- **\u2205**: a drafted token with no text of its own (a special token, or part of a character); **\u21b5**: a newline.
- **Accepted / call**: drafted tokens kept per target forward pass; each call also adds one token of the target's.
- **Arm probabilities**: how likely the bandit was to pick each drafter before each round. A drafter with nothing
  to propose that round (no match) is *asleep*: probability 0.
- **Regret**: tokens lost so far against always using the drafter that turned out best; *measured* with
  full-information feedback, *estimated* otherwise.
- **Speed-up**: the engine's tokens/s over the target alone on the same prompt, both measured here on the
  *engine clock*: the time inside the engine, without the page's drawing, for both sides alike.
- **Pseudo-rounds**: the bandit starts from what the preset measured on earlier prompts, counted as if each
  drafter had already been tried a few rounds; *Start cold* (More settings) starts it from nothing.
- **bd / be** (reward): *block divergence*, how closely the drafter's distribution matched the target's at every
  drafted position (MetaSD's reward), or *block efficiency*, the share of the draft accepted.
- **Drafter kinds**: *model-free* copies text it has seen; *self* is the target with layers skipped;
  *distilled* is a small model trained on the target's answers; *white-box* reads the target's hidden states.
- **Token tree** (policy metasd-tree): several drafters' proposals verified together as branches; its *budget*
  is the most ids one pass verifies; *+n* marks the ids of the branches that were not kept.
- **The answer itself** comes from the target, a small model here: speculative decoding keeps it exactly,
  right or wrong, only faster.
- **Drafter lanes** (under the answer and its plots): one row per drafter of the request, one cell per token of the answer.
  A cell's fill height is that drafter's acceptance probability at that token, given the true text before it
  (its prediction teacher-forced on the answer): in greedy decoding full (it would have proposed exactly this
  token) or empty. Read along a row to see *where* a drafter is right: prompt lookup on copied spans, a math
  drafter on arithmetic. The outlined cells are the drafter the bandit actually pulled in that round, a dark
  rule starts each round, and the percentage is the share of the answer the drafter would have drafted. Hover
  a cell for drafter, token and number, or Tab to the lanes and move with the arrow keys. With full-information
  feedback they fill in live; otherwise they come a moment after the answer ends (one teacher-forced pass per
  model drafter), never slowing it.
"""

EXPLAIN = r"""
### Speculative decoding
A cheap **drafter** proposes $\gamma$ tokens; the **target** checks them all in one forward pass.
Draft token $x$ (drafter probability $q(x)$, target probability $p(x)$) is accepted with probability
$$\min\left(1, \frac{p(x)}{q(x)}\right)$$
At the first rejection a replacement is sampled from $\mathrm{norm}(\max(0, p - q))$; if all $\gamma$ pass, the
target adds a **bonus token**. The output has exactly the target's distribution (lossless). Per position the
acceptance rate is $\beta = \sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)$, and with i.i.d. acceptance $\alpha$
$$\mathbb{E}[\text{tokens per target call}] = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}, \qquad
\text{speed-up} = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}$$
where $c$ is the cost of one drafter step relative to one target step.

### The bandit
Each drafter is an **arm**; every round a policy picks one and observes a **reward** in $[0, 1]$.
MetaSD's block divergence uses the target's distributions at every drafted position,
$$r_{BD} = \frac{1}{\gamma} \sum_{j=1}^{\gamma} \left(1 - \mathrm{TV}(p_j, q_j)\right),$$
far less noisy than the block efficiency $r_{BE} = \text{accepted} / \gamma$. MetaSD-UCB pulls every arm once, then
$$a_t = \arg\max_i \; \hat{\mu}_i + \beta \sqrt{\frac{2 \ln t}{n_i}}$$
With **full-information feedback** every drafter is scored on every verified chunk, and Hedge plays
$P(i) \propto \exp(\eta \sum_s r_{i,s})$, whose regret grows with $\log K$ rather than $K$.
Neither $r_{BD}$ nor $r_{BE}$ sees the drafter's cost; the **throughput** reward does.

### Regret
Tokens lost against the best drafter in hindsight. Here, with known rates: in the time $\tau_{a_t} = \gamma c_{a_t} + 1$
the chosen drafter used, the best one would have produced $v^* \tau_{a_t}$ tokens ($v_i$ = expected tokens per target step), so
$$R_T = \sum_{t=1}^{T} \left( v^* \tau_{a_t} - \mathbb{E}[\text{tokens}_{a_t}] \right)$$
Good policies bend the curve flat (logarithmic); a cost-blind reward with an expensive, accurate drafter keeps it rising.
"""

# Display math in $$ ... $$, inline math in $ ... $ (EXPLAIN's notation).
LATEX_DELIMITERS = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]

ARM_CAPTION = ("The policy's probability of choosing each drafter before every round "
               "(stacked); the ticks below mark the drafter it pulled.")
REGRET_CAPTION = ("Tokens lost so far against always using the drafter that was best in "
                  "hindsight; a curve that flattens means the bandit found it.")
COMPARE_INTRO = ("Each drafter alone (`single:<name>`) and the bandit, greedy, against the target alone measured "
                 "in the same run. Speed-ups are measured, never computed from formulas.")
COMPARE_SET_NOTE = ("Runs share the model with the Generate tab one step at a time: other users' answers are "
                    "served between the steps. Cancel keeps the results so far.")
LANE_GRID_NOTE = ("**Drafter lanes by prompt**: for each prompt of the set (the bandit's answer), the share of the "
                  "answer each drafter would have drafted, and where (three glyphs: its first, middle and last "
                  "third; ▁ none, █ all). Click a row's cell to open that prompt's run in Replay, lanes "
                  "and all.")
REPLAY_INTRO = ("Replay a recorded run at any speed, without a model: prepare runs before class (on a GPU "
                "too), then play them here, or step through them round by round. Share one with a link: "
                "`?run=<name>`. Upload the JSON from *Per-round log* or `python -m metasd generate --json`.")

# Keyboard: Ctrl+Enter (Cmd+Enter) runs, Esc stops. Captured before the text box sees the keys, so a
# Ctrl+Enter in the prompt does not also submit it a second time.
HEAD = """<script>
// Bring an element to the top of the window when it is out of sight: above it (a projector-sized window
// scrolled down to the examples) or low in it (a narrow screen, where the answer sits below the settings).
const bringIntoView = (id) => setTimeout(() => {
  const t = document.getElementById(id);
  if (!t) return;
  const top = t.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight * 0.6) t.scrollIntoView({behavior: "smooth", block: "start"});
}, 50);
const showAnswer = () => bringIntoView("tokens");
document.addEventListener("click", (e) => {
  if (!e.target.closest) return;
  if (e.target.closest("#run")) showAnswer();
  // An example fills the prompt: show it (and Run beside the answer) rather than the list below them.
  else if (e.target.closest("#examples") && !e.target.closest(".paginate")) bringIntoView("prompt");
}, true);
document.addEventListener("keydown", (e) => {
  const click = (id) => {
    const b = document.getElementById(id);
    if (b && !b.disabled) { b.click(); return true; }
    return false;
  };
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    if (click("run")) { e.preventDefault(); e.stopPropagation(); showAnswer(); }
  }
  else if (e.key === "Escape") { click("stop"); }
}, true);
// Drafter lanes: one tab stop per table; the arrow keys, Home and End move the focus (and the stop) between its
// cells, whose labels say drafter, token and number.
document.addEventListener("keydown", (e) => {
  const cell = e.target.closest && e.target.closest(".lanes td");
  if (!cell) return;
  const row = cell.parentElement, rows = [...row.parentElement.rows], col = [...row.cells].indexOf(cell);
  const r = rows.indexOf(row);
  const moves = {ArrowRight: row.cells[col + 1], ArrowLeft: row.cells[col - 1], Home: row.cells[1],
                 End: row.cells[row.cells.length - 1], ArrowDown: rows[r + 1] && rows[r + 1].cells[col],
                 ArrowUp: rows[r - 1] && rows[r - 1].cells[col]};
  if (!(e.key in moves)) return;
  e.preventDefault();
  const next = moves[e.key];
  if (!next || next.tagName !== "TD") return;
  cell.setAttribute("tabindex", "-1");
  next.setAttribute("tabindex", "0");
  next.focus();
});
</script>"""

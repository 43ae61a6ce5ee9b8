// A plan's exports for PyTorch (GET /api/plans/{id}/export?format=...): the DTensor
// parallelize module, torchtitan 0.3's command line (and the TOML of older torchtitan),
// Megatron-LM's pretrain_gpt.py options and the parameter placements JSON.
// Links download with the session cookie like the trace; a click fetches first so that an
// export the service refuses (a partial parameter, say) shows its message here instead of
// saving the error as a file.
import { ApiError } from "../api.js";
import { errorBox, h } from "../ui.js";

const FORMATS = [
  ["dtensor", "DTensor parallelize module", "parallelize(model) for torch.distributed"],
  ["torchtitan", "torchtitan arguments", "torchtitan 0.3: --module llama3 --config ... --parallelism.*"],
  ["torchtitan-toml", "torchtitan TOML", "before 0.3: [parallelism] and [activation_checkpoint]"],
  ["megatron", "Megatron-LM arguments", "pretrain_gpt.py: --tensor-model-parallel-size ..."],
  ["json", "Parameter placements JSON", "every parameter's placement, for other tools"],
];

function filenameOf(response, fallback) {
  const found = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") ?? "");
  return found ? found[1] : fallback;
}

async function download(event, link, status) {
  event.preventDefault();
  status.replaceChildren();
  const response = await fetch(link.href, { credentials: "same-origin" });
  if (!response.ok) {
    const text = await response.text();
    status.append(errorBox(new ApiError(response.status, text ? JSON.parse(text) : null)));
    return;
  }
  const notes = JSON.parse(response.headers.get("X-Export-Notes") ?? "[]");
  if (notes.length) status.append(h("ul", { "aria-label": "export notes" }, notes.map((n) => h("li", {}, n))));
  const url = URL.createObjectURL(await response.blob());
  const save = h("a", { href: url, download: filenameOf(response, "export") });
  document.body.append(save);
  save.click();
  save.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** The "Export for PyTorch" section of plan `planId`'s overview. */
export function exportSection(planId) {
  const status = h("div", { "aria-live": "polite" });
  const items = FORMATS.map(([format, label, what]) => {
    const link = h("a", { href: `/api/plans/${planId}/export?format=${format}`, download: "" }, label);
    link.addEventListener("click", (event) => download(event, link, status).catch((err) =>
      status.replaceChildren(errorBox(err))));
    return h("li", {}, link, h("span", { class: "muted" }, ` — ${what}`));
  });
  return h("section", { "aria-label": "export for PyTorch" },
    h("h2", {}, "Export for PyTorch"), h("ul", {}, items), status);
}

// Fill the preset table from the REST API.
const body = document.getElementById("presets");

async function main() {
  const presets = await (await fetch("/api/presets")).json();
  body.replaceChildren();
  for (const p of presets) {
    const detail = await (await fetch(`/api/presets/${encodeURIComponent(p.name)}`)).json();
    const row = document.createElement("tr");
    for (const [text, cls] of [
      [p.name, ""], [p.description, ""],
      [detail.params.toLocaleString("en-US"), "num"], [String(detail.layers), "num"],
    ]) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      row.append(td);
    }
    body.append(row);
  }
}

main().catch((err) => { body.textContent = `failed to load presets: ${err}`; });

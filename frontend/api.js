// The REST client: every view loads its data through `api` (same-origin session cookie).

/** An API answer other than 2xx: the service's `{code, message, detail}` with the status. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message ?? `HTTP ${status}`);
    this.status = status;
    this.code = body?.code ?? `http_${status}`;
    this.detail = body?.detail ?? {};
  }

  /** The request field this error concerns (`body.mesh` -> "mesh"), if it names one. */
  get field() {
    const loc = this.detail.errors?.[0]?.loc ?? this.detail.field ?? "";
    return String(loc).replace(/^body\./, "").split(".")[0] || null;
  }
}

/** `fetch` the API path; JSON in and out. Throws ApiError for non-2xx answers. */
export async function api(path, { method = "GET", body, raw } = {}) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (raw !== undefined) {
    init.body = raw;
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** One page of a list the service pages (`?limit=&offset=`): its rows and the total it
 * counts (the `X-Total-Count` header). Throws ApiError for non-2xx answers. */
export async function apiPage(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data);
  const total = Number(response.headers.get("X-Total-Count") ?? data.length);
  return { items: data, total };
}

/** Follow a job's server-sent events; `onProgress(job)` for each update. Resolves with the
 * final job. `signal` (AbortSignal) stops listening. */
export function followJob(jobId, onProgress, signal) {
  return new Promise((resolve, reject) => {
    const source = new EventSource(`/api/jobs/${jobId}/events`);
    const stop = () => source.close();
    signal?.addEventListener("abort", () => { stop(); resolve(null); });
    source.addEventListener("progress", (e) => onProgress(JSON.parse(e.data)));
    source.addEventListener("end", async () => {
      stop();
      try { resolve(await api(`/api/jobs/${jobId}`)); } catch (err) { reject(err); }
    });
    source.onerror = async () => {
      // the stream ended (time limit) or failed: read the job once and go on polling via SSE
      stop();
      try {
        const job = await api(`/api/jobs/${jobId}`);
        onProgress(job);
        if (["queued", "running"].includes(job.status)) {
          resolve(await followJob(jobId, onProgress, signal));
        } else {
          resolve(job);
        }
      } catch (err) { reject(err); }
    };
  });
}

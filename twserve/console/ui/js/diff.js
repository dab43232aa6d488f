// A line diff (longest common subsequence) for the config's "review before saving".

export function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  // Common head and tail first: an edit usually touches a few lines of a long file.
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const x = a.slice(head, a.length - tail);
  const y = b.slice(head, b.length - tail);
  const out = [];
  for (let i = 0; i < head; i++) out.push({ op: " ", text: a[i], old: i + 1, new: i + 1 });
  if (x.length * y.length > 4_000_000) {
    x.forEach((t, i) => out.push({ op: "-", text: t, old: head + i + 1 }));
    y.forEach((t, j) => out.push({ op: "+", text: t, new: head + j + 1 }));
  } else {
    const n = x.length;
    const m = y.length;
    const len = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--)
      for (let j = m - 1; j >= 0; j--) len[i][j] = x[i] === y[j] ? len[i + 1][j + 1] + 1 : Math.max(len[i + 1][j], len[i][j + 1]);
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && x[i] === y[j]) {
        out.push({ op: " ", text: x[i], old: head + i + 1, new: head + j + 1 });
        i++;
        j++;
      } else if (j < m && (i === n || len[i][j + 1] >= len[i + 1][j])) {
        out.push({ op: "+", text: y[j], new: head + j + 1 });
        j++;
      } else {
        out.push({ op: "-", text: x[i], old: head + i + 1 });
        i++;
      }
    }
  }
  for (let k = tail; k > 0; k--) out.push({ op: " ", text: a[a.length - k], old: a.length - k + 1, new: b.length - k + 1 });
  return out;
}

// The changed lines with `context` unchanged lines around each change.
export function hunks(diff, context = 3) {
  const keep = new Array(diff.length).fill(false);
  diff.forEach((d, i) => {
    if (d.op !== " ") for (let k = Math.max(0, i - context); k <= Math.min(diff.length - 1, i + context); k++) keep[k] = true;
  });
  const out = [];
  diff.forEach((d, i) => {
    if (keep[i]) out.push(d);
    else if (out.length && out[out.length - 1].op !== "…") out.push({ op: "…", text: "" });
  });
  return out;
}

// validate.mjs FILE... — read each BPMN 2.0 file with bpmn-moddle and print one JSON line per
// file: the reader's warnings (unknown elements or attributes, unresolved references), whether it
// writes back, and the flow elements and artifacts that have no diagram element (shape or edge).
// internal/gen's TestBPMNValidates runs it on every generated .bpmn file.
import { readFile } from 'node:fs/promises';
import { BpmnModdle } from 'bpmn-moddle';

for (const file of process.argv.slice(2)) {
  const moddle = new BpmnModdle();
  const out = { file, warnings: [], undrawn: [], elements: 0, diagramElements: 0, writes: false };
  try {
    const { rootElement, warnings } = await moddle.fromXML(await readFile(file, 'utf8'), 'bpmn:Definitions');
    out.warnings = warnings.map((w) => w.message);
    const drawn = new Set();
    for (const diagram of rootElement.diagrams || []) {
      for (const el of diagram.plane.planeElement || []) {
        if (el.bpmnElement) drawn.add(el.bpmnElement.id);
        out.diagramElements++;
      }
    }
    const visit = (container) => {
      for (const el of [...(container.flowElements || []), ...(container.artifacts || [])]) {
        out.elements++;
        if (!drawn.has(el.id)) out.undrawn.push(el.id);
        if (el.flowElements) visit(el);
      }
    };
    for (const root of rootElement.rootElements) {
      if (root.$type === 'bpmn:Process') visit(root);
    }
    const { xml } = await moddle.toXML(rootElement, { format: true });
    out.writes = xml.includes('bpmn:process');
  } catch (err) {
    out.error = String(err && err.message ? err.message : err);
  }
  console.log(JSON.stringify(out));
}

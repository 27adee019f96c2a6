#!/usr/bin/env node
// Start work when this node becomes leader, stop it when it stops leading.
// No packages: Node's http module speaks HTTP over leaderd's Unix socket.
//   node follow-leader.js [/run/leaderd/leaderd.sock] [election]
'use strict';
const http = require('http');

const socketPath = process.argv[2] || '/run/leaderd/leaderd.sock';
const election = process.argv[3] || 'default';

function watch(revision) {
  // One long poll: answers once the revision differs from ours, or after 30 s.
  const path = `/watch/${election}?timeout=30&revision=${revision}`;
  return new Promise((resolve, reject) => {
    const req = http.get({ socketPath, path, timeout: 35000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => { body += chunk; });
      res.on('end', () => {
        try { resolve(JSON.parse(body)); } catch (err) { reject(err); }
      });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

function startWork(term) {
  // Real work passes the term on as a fencing token to what it writes to.
  const timer = setInterval(() => console.log(`working with fencing term ${term}`), 1000);
  return { stop: () => clearInterval(timer) };
}

async function main() {
  let revision = 0;  // revisions start at 1: the first answer is the current state
  let work = null;
  for (;;) {
    let status;
    try {
      status = await watch(revision);
    } catch (err) {
      console.log(`leaderd unreachable (${err.message}); not leading`);
      status = { is_leader: false, role: 'unknown', term: 0, revision: 0 };
      await new Promise((r) => setTimeout(r, 1000));
    }
    revision = status.revision;
    if (status.is_leader && !work) {
      console.log(`became leader, term ${status.term}: starting work`);
      work = startWork(status.term);
    } else if (!status.is_leader && work) {
      console.log(`no longer leader (${status.role}): stopping work`);
      work.stop();
      work = null;
    }
    if (status.role === 'stopped') {
      console.log('leaderd stopped');
      return;
    }
  }
}

main();

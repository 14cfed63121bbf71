// gpuwatt: relays a click on an alert's "silence" button or a silence's "expire" button on the
// alerts page into the `alerts-click` store, as {id: <the button's id>, at: <ms>}; the
// dashboard's callback (dashboard/alert_actions.py) acts on it. One listener on the document
// sees the click itself, so a redraw of the page's content at that moment (its live refresh, a
// slow answer) cannot drop it, as it could when the buttons were a pattern-matching callback
// input. Buttons exist only on a dashboard with credentials, whose callback checks them.
// A click that a redraw split between two buttons (pressed on one, released on its redrawn
// twin) comes here as well: redrawn_clicks.js clicks the twin.
(function () {
    'use strict';
    var ACTIONS = ['alert-silence', 'silence-expire'];

    function actionOf(target) {
        var button = target && target.closest ? target.closest('button[id^="{"]') : null;
        if (!button) {
            return null;
        }
        var id;
        try {
            id = JSON.parse(button.id);
        } catch (e) {
            return null;
        }
        return id && ACTIONS.indexOf(id.type) >= 0 ? id : null;
    }

    function relay(id) {
        var dc = window.dash_clientside;
        if (dc && dc.set_props) {
            dc.set_props('alerts-click', {data: {id: id, at: Date.now()}});
        }
    }

    document.addEventListener('click', function (event) {
        var id = actionOf(event.target);
        if (id) {
            relay(id);
        }
    }, true);
})();
